"""deploy/ says what `gptpipe servers` does: the compose file's databases, flags and bindings match it."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from flows.servers.team import AUTH_CACHE_SECONDS, DATABASES

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_the_compose_file_makes_the_same_databases_and_servers_as_gptpipe_servers() -> None:
    created = re.findall(r"CREATE DATABASE (\w+);", (DEPLOY / "initdb.sql").read_text())
    assert tuple(created) == DATABASES
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    assert set(services) == {"postgres", "mlflow", "prefect"}
    mlflow = " ".join(services["mlflow"]["command"])
    assert "--app-name basic-auth" in mlflow and "--artifacts-destination" in mlflow
    # The password cache the load figures depend on (docs/deployment.md): the same as gptpipe servers'.
    assert f"auth_cache_ttl_seconds = {AUTH_CACHE_SECONDS}" in mlflow
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


def in_build_context(path: str, rules: list[str]) -> bool:
    """Whether `docker build .` sends `path` (relative to the root), by .dockerignore's rules: the last
    rule matching the path or one of its folders decides, `!` letting it back in; `**/x` matches `x` at
    any depth."""
    import fnmatch

    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for rule in rules:
        pattern = rule.removeprefix("!")
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatchcase(part, pattern[3:]) for part in parts)
        else:
            hit = any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes)
        if hit:
            included = rule.startswith("!")
    return included


def test_the_image_gets_the_code_and_never_a_secret_state_or_data() -> None:
    root = DEPLOY.parent
    rules = [line.strip() for line in (root / ".dockerignore").read_text().splitlines()]
    rules = [rule for rule in rules if rule and not rule.startswith("#")]
    kept_out = [
        "deploy/secrets.env", "servers/mlflow.password", "servers/initdb.password", "servers/client.env",
        "client.env", ".venv/bin/python", "data/tokens/x/train.bin", "checkpoints/run/final.pt",
        "mlruns/mlflow.db", "mlruns/outbox/a.jsonl", ".prefect/storage/result", ".git/config",
        "gptcore/__pycache__/errors.cpython-311.pyc",
    ]  # fmt: skip
    let_in = ["pyproject.toml", "README.md", "prefect.toml", "gptcore/errors.py", "flows/cli/main.py",
              "tasks/stage.py", "params/iteration_1.yaml"]  # fmt: skip
    assert [path for path in kept_out if in_build_context(path, rules)] == []
    assert [path for path in let_in if not in_build_context(path, rules)] == []
