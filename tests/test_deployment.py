"""The deployments in prefect.yaml, for real: a Prefect server on 127.0.0.1, `prefect deploy --all`, a
triggered run picked up by a process worker started once, and the run seen Completed."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from test_pipeline import write_corpus, write_params

REPO = Path(__file__).resolve().parent.parent
PREFECT = [sys.executable, "-m", "prefect"]
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def wait_healthy(api: str, server: subprocess.Popen, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert server.poll() is None, "prefect server exited during start"
        try:
            get_json(f"{api}/health")
            return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"prefect server not healthy at {api} within {seconds} s")


def prefect(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    result = subprocess.run(
        [*PREFECT, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, (
        f"prefect {' '.join(args)}:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    )
    return result.stdout


def test_deployed_iteration_1_runs_to_completed_on_a_process_worker(tmp_path: Path) -> None:
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(tmp_path / "prefect-home" / "storage"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_URL": api,
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }
    server = subprocess.Popen(
        [*PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-services"],
        env={**env, "PREFECT_API_URL": ""},
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(api, server)
        prefect(env, "work-pool", "create", "gptpipe-process", "--type", "process")
        deployed = prefect(env, "--no-prompt", "deploy", "--all")
        for name in ("iteration-1-nightly", "iteration-2", "iteration-3"):
            assert name in deployed

        write_corpus(tmp_path, documents=12)
        params = write_params(tmp_path)
        triggered = prefect(
            env,
            "deployment",
            "run",
            "end-to-end/iteration-1-nightly",
            "--param",
            f"params_path={params}",
            "--param",
            "until=tokens",
        )
        flow_run_id = UUID.search(triggered.split("UUID", 1)[-1]).group(0)

        prefect(env, "worker", "start", "--pool", "gptpipe-process", "--run-once", timeout=180)

        run = get_json(f"{api}/flow_runs/{flow_run_id}")
        assert run["state"]["type"] == "COMPLETED", run["state"]
        assert any((tmp_path / "data" / "tokens").iterdir())
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
