"""`gptpipe serve`: a logged model behind MLflow's own model server, on loopback unless asked otherwise."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from flows.cli_options import resolve_params
from flows.cli_tracking import is_loopback
from gptcore.errors import GptpipeError


def serve_command(
    model: str = typer.Option(
        ...,
        "--model",
        help="models:/gptpipe-iteration-1@champion, models:/NAME/VERSION, models:/ID or a folder",
    ),
    params_file: Path | None = typer.Option(None, "--params", help="parameter file naming the store"),
    iteration: int | None = typer.Option(None, "--iteration", min=1),
    host: str = typer.Option("127.0.0.1", "--host", help="address to bind; loopback unless you ask"),
    port: int = typer.Option(5001, "--port", min=1, max=65535),
) -> None:
    """Serve a logged model (`mlflow models serve`): POST /invocations with
    {"inputs": ["def main("], "params": {"max_new_tokens": 40}} answers {"predictions": [...]}.
    Ctrl-C or SIGTERM stops the server and every process it started."""
    from gptcore.launch import run_process_tree
    from tasks.tracking.model_uri import ModelNotFound, artifact_location
    from tasks.tracking.store import connect, redact, resolve_target

    _, params = resolve_params(params_file, iteration, [])
    target = resolve_target(params.tracking)
    client = connect(target)  # an unreachable store stops here, before any server starts
    try:
        location = artifact_location(client, model)
    except Exception as error:  # MLflow names a missing model, alias or version in many kinds
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelNotFound(f"--model {model}: not in {redact(target.uri)} ({reason[:300]})") from None
    if not is_loopback(host):
        print(
            f"warning: --host {host}: the model server will be reachable from other machines", file=sys.stderr
        )
    shown = f"[{host}]" if ":" in host else host
    print(f"serving {model} at http://{shown}:{port}/invocations  (Ctrl-C stops it)", flush=True)
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", location, "--env-manager", "local"]
    command += ["-h", host, "-p", str(port)]
    # MLflow starts uvicorn by name: this interpreter's scripts must come first on PATH.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["MLFLOW_TRACKING_URI"] = target.uri
    try:
        code = run_process_tree(command, lambda line: print(line, file=sys.stderr, flush=True), env=env)
    except KeyboardInterrupt:
        return
    if code not in (0, -2, -15, 130, 143):
        raise GptpipeError(f"the model server exited with status {code} (is port {port} in use? try --port)")
