"""A sweep across machines, on one: the session's Prefect server on loopback, a process work pool and two
workers, one trial at a time each; `gptpipe sweep --work-pool` submits two tiny trials, each worker takes
one, the table is complete. The test holds the device until both trials wait for it: a worker busy with
one trial cannot take the other, so who took what is decided by the limit, not by who polled first."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from process_support import FORKED_PREFECT, Lines, forked_process_pool, stop_process_group
from slot_support import holding_the_device
from test_sweep import LEARNING_RATES, SWEEP_CEILING, sweep

from tasks.device_slot import device_limit_names

pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=40)]
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(SWEEP_CEILING + 60)
def test_two_process_workers_take_the_trials_of_a_sweep(tmp_path: Path, prefect_env: dict[str, str]) -> None:
    env = {**prefect_env, "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_LOGGING_LEVEL": "INFO"}  # runs named
    started: list[subprocess.Popen] = []
    workers: list[Lines] = []
    waited = f"waiting for {device_limit_names('cpu')[0]}"

    def both_workers_hold_a_waiting_trial(_: Lines) -> None:
        with holding_the_device("cpu", prefect_env):
            for worker in workers:
                worker.wait_for(lambda lines: any(waited in line for line in lines))

    try:
        template = ("--base-job-template", str(forked_process_pool(tmp_path)))  # the trials' runs forked
        create = [*FORKED_PREFECT, "work-pool", "create", "sweep-test", "--type", "process", *template]
        subprocess.run(create, env=env, check=True)
        for index in (1, 2):
            command = [*FORKED_PREFECT, "worker", "start", "--pool", "sweep-test", "--name", f"w{index}"]
            command += ["--limit", "1"]  # one trial at a time: a worker with a trial waiting takes no other
            process = subprocess.Popen(
                command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True,
            )  # fmt: skip
            started.append(process)
            workers.append(Lines(process.stdout))
        pool = ("--work-pool", "sweep-test")
        done, _ = sweep(tmp_path, env, LEARNING_RATES, *pool, meanwhile=both_workers_hold_a_waiting_trial)
    finally:
        for process in reversed(started):
            stop_process_group(process)

    flow_runs = dict(
        re.findall(r"\[(trial-\d+)\] submitted to work pool sweep-test as flow run (\S+)", done.stderr)
    )
    assert len(flow_runs) == 2
    taken = [{name for name, run in flow_runs.items() if run in worker.text()} for worker in workers]
    assert all(taken) and taken[0] | taken[1] == set(flow_runs)  # both workers took trials, all were taken
