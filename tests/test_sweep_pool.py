"""A sweep across machines, on one: the session's Prefect server on loopback, a process work pool and two
workers, one trial at a time each; `gptpipe sweep --work-pool` submits two tiny trials, each worker takes
one (a trial takes seconds, a worker asks every second), the table is complete."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from process_support import stop_process_group
from test_sweep import LEARNING_RATES, sweep

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent
PREFECT = str(Path(sys.executable).parent / "prefect")


def test_two_process_workers_take_the_trials_of_a_sweep(tmp_path: Path, prefect_env: dict[str, str]) -> None:
    env = {**prefect_env, "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_LOGGING_LEVEL": "INFO"}  # runs named
    started: list[subprocess.Popen] = []

    def launch(*command: str, log: Path | None = None) -> subprocess.Popen:
        out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115  (closed with the process)
        process = subprocess.Popen(
            list(command), env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        started.append(process)
        return process

    try:
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

        done, _ = sweep(tmp_path, env, LEARNING_RATES, "--work-pool", "sweep-test")
    finally:
        for process in reversed(started):
            stop_process_group(process)

    flow_runs = dict(
        re.findall(r"\[(trial-\d+)\] submitted to work pool sweep-test as flow run (\S+)", done.stderr)
    )
    assert len(flow_runs) == 2
    taken = [{name for name, run in flow_runs.items() if run in log.read_text()} for log in logs]
    assert all(taken) and taken[0] | taken[1] == set(flow_runs)  # both workers took trials, all were taken
