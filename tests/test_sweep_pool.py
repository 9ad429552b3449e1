"""A sweep across machines, on one: a real `prefect server start` on loopback, a process work pool and two
workers; `gptpipe sweep --work-pool` submits four tiny trials, both workers take trials, the table is
complete."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from process_support import free_port, stop_process_group
from test_sweep import sweep_2x2

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent
PREFECT = str(Path(sys.executable).parent / "prefect")


def test_two_process_workers_take_the_trials_of_a_sweep(tmp_path: Path) -> None:
    home, port = tmp_path / "prefect-home", free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(home / "storage"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }
    started: list[subprocess.Popen] = []

    def launch(*command: str, log: Path | None = None) -> subprocess.Popen:
        out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115  (closed with the process)
        process = subprocess.Popen(
            list(command), env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        started.append(process)
        return process

    try:
        launch(PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port))
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{env['PREFECT_API_URL']}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "prefect server start did not come up"
                time.sleep(0.5)
        subprocess.run(
            [PREFECT, "work-pool", "create", "sweep-test", "--type", "process"], env=env, check=True
        )
        logs = [tmp_path / f"worker-{index}.log" for index in (1, 2)]
        for index, log in enumerate(logs, 1):
            launch(
                PREFECT,
                "worker",
                "start",
                "--pool",
                "sweep-test",
                "--name",
                f"w{index}",
                "--limit",
                "1",
                log=log,
            )

        done, _ = sweep_2x2(tmp_path, env, "--work-pool", "sweep-test")
    finally:
        for process in reversed(started):
            stop_process_group(process)

    flow_runs = dict(
        re.findall(r"\[(trial-\d+)\] submitted to work pool sweep-test as flow run (\S+)", done.stderr)
    )
    assert len(flow_runs) == 4
    taken = [{name for name, run in flow_runs.items() if run in log.read_text()} for log in logs]
    assert all(taken) and taken[0] | taken[1] == set(flow_runs)  # both workers took trials, all were taken
