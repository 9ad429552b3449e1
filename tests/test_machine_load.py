"""Each speed is recorded with the machine's load over its measurement: the CPU time other processes
spent meanwhile counts as theirs, the run's own (its threads, its children) never does."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
from test_trainer import Recorder, job

from gptcore.runtime import load
from gptcore.runtime.load import MachineLoad
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
    assert figures["load_average"] >= 0


def test_a_child_of_the_run_is_the_runs_own_time() -> None:
    tree = load._Tree()
    before = tree.seconds()
    subprocess.run([sys.executable, "-c", BUSY], check=True)
    assert tree.seconds() - before >= 0.6 - 0.05


def test_every_step_line_and_the_summary_carry_the_load() -> None:
    recorder = Recorder()
    summary = train(job(training={"max_steps": 4, "log_every": 2, "eval_every": 4}), recorder)
    for record in [*recorder.of("step"), summary.to_dict()]:
        assert record["load_average"] >= 0 and record["other_cpu_cores"] >= 0
