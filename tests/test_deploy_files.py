"""deploy/ says what `gptpipe servers` does: the compose file's databases, flags and bindings match it."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from flows.servers.team import DATABASES

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_the_compose_file_makes_the_same_databases_and_servers_as_gptpipe_servers() -> None:
    created = re.findall(r"CREATE DATABASE (\w+);", (DEPLOY / "initdb.sql").read_text())
    assert tuple(created) == DATABASES
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    assert set(services) == {"postgres", "mlflow", "prefect"}
    mlflow = " ".join(services["mlflow"]["command"])
    assert "--app-name basic-auth" in mlflow and "--artifacts-destination" in mlflow
    assert services["mlflow"]["environment"]["MLFLOW_BACKEND_STORE_URI"].endswith("/mlflow")
    prefect = services["prefect"]["environment"]
    assert prefect["PREFECT_API_DATABASE_CONNECTION_URL"].endswith("/prefect")
    assert "PREFECT_SERVER_API_AUTH_STRING" in prefect
    # Published on the host's loopback only, as `gptpipe servers` binds unless told otherwise.
    for name in ("mlflow", "prefect"):
        assert all(port.startswith("127.0.0.1:") for port in services[name]["ports"])
    # No secret in the file: every one comes from deploy/secrets.env, which git ignores.
    assert "change-me" not in (DEPLOY / "compose.yaml").read_text()
    assert "/deploy/secrets.env" in (DEPLOY.parent / ".gitignore").read_text().splitlines()
