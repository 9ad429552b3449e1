"""Each speed is recorded with the machine's load over its measurement: the CPU time other processes
spent meanwhile counts as theirs, the run's own (its threads, its children) never does."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest
from test_trainer import Recorder, job

from gptcore.runtime import load
from gptcore.runtime.load import MachineLoad
from gptcore.train import trainer
from gptcore.train.trainer import train

BUSY = "import time\nwhile time.process_time() < 0.6: pass\n"  # 0.6 s of CPU, however slow the machine


def test_an_outside_process_busy_meanwhile_is_counted_as_other_cores() -> None:
    started = time.monotonic()
    measured = MachineLoad()
    # A grandchild left behind by its shell: reparented, so no longer in this process's tree.
    shell = f"{sys.executable} -c '{BUSY}' & echo $!"
    pid = int(subprocess.run(["sh", "-c", shell], capture_output=True, text=True, check=True).stdout)
    psutil.Process(pid).wait(timeout=120)
    wall = time.monotonic() - started  # a little longer than the measurement: the product only grows
    figures = measured.whole()
    assert figures["other_cpu_cores"] * wall >= 0.6 - 0.05  # its CPU seconds, give or take the tick


def test_a_child_of_the_run_is_the_runs_own_time() -> None:
    tree = load._Tree()
    before = tree.seconds()
    subprocess.run([sys.executable, "-c", BUSY], check=True)
    assert tree.seconds() - before >= 0.6 - 0.05


class KnownLoad:
    """A machine load whose figures the test knows: a new pair for each interval, another for the whole."""

    def __init__(self) -> None:
        self.intervals = 0

    def interval(self) -> dict[str, float]:
        self.intervals += 1
        return {"load_average": 1.5 * self.intervals, "other_cpu_cores": 0.25 * self.intervals}

    def whole(self) -> dict[str, float]:
        return {"load_average": 0.75, "other_cpu_cores": 0.125}


def test_every_step_line_carries_its_intervals_load_and_the_summary_the_whole_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trainer, "MachineLoad", KnownLoad)
    recorder = Recorder()
    summary = train(job(training={"max_steps": 4, "log_every": 2, "eval_every": 4}), recorder)
    lines = [(r["step"], r["load_average"], r["other_cpu_cores"]) for r in recorder.of("step")]
    assert lines == [(2, 1.5, 0.25), (4, 3.0, 0.5)]
    assert (summary.to_dict()["load_average"], summary.to_dict()["other_cpu_cores"]) == (0.75, 0.125)
