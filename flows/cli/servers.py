"""`gptpipe servers`: a team's MLflow and Prefect servers on PostgreSQL, started and stopped together."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import typer

from flows.cli.dependencies import missing_dependency


def servers_command(
    state: Path = typer.Option(Path("servers"), "--state", help="folder of the database, artifacts, secrets"),
    host: str = typer.Option("127.0.0.1", "--host", help="address the servers bind; loopback unless asked"),
    mlflow_port: int = typer.Option(5000, "--mlflow-port", min=1, max=65535),
    prefect_port: int = typer.Option(4200, "--prefect-port", min=1, max=65535),
    postgres_port: int = typer.Option(5432, "--postgres-port", min=1, max=65535, help="on loopback only"),
    auth: bool = typer.Option(False, "--auth/--no-auth", help="MLflow basic-auth and Prefect's auth string"),
    workers: int = typer.Option(2, "--workers", min=1, help="MLflow server worker processes"),
    allowed_hosts: str | None = typer.Option(
        None, "--allowed-hosts", help="Host headers MLflow accepts (default: localhost and private addresses)"
    ),
) -> None:
    """Start PostgreSQL, MLflow's tracking server and Prefect's server on it; Ctrl-C stops them all."""
    from flows.cli.tracking import is_loopback
    from flows.servers.team import ServerSettings, Stack

    for module in ("psycopg", *(("flask_wtf",) if auth else ())):
        if importlib.util.find_spec(module) is None:
            raise missing_dependency(ModuleNotFoundError(name=module)) or RuntimeError(module)
    settings = ServerSettings(
        state, host, mlflow_port, prefect_port, postgres_port, auth, workers, allowed_hosts
    )
    if not is_loopback(host):
        print(f"warning: --host {host}: the servers will be reachable from other machines", file=sys.stderr)
    stack = Stack(settings)

    def ready() -> None:
        env = stack.client_environment()
        client_env = stack.write_client_env()
        print(
            f"servers ready: MLflow {env['MLFLOW_TRACKING_URI']}, Prefect {env['PREFECT_API_URL']} "
            f"(state {state}; Ctrl-C stops them)",
            flush=True,
        )
        secret = ", credentials included: share it as a secret" if auth else ""
        print(f"clients: set -a; . {client_env}; set +a   (the client variables{secret})", flush=True)

    try:
        stack.run(lambda name, line: print(f"{name:8} | {line}", flush=True), ready)
    except KeyboardInterrupt:
        return
