"""`kill -9` at placed moments of a CPU fp32 run, after seeded steps and inside each point of a checkpoint
write: each `--resume` continues from the last complete checkpoint, and the final weights equal an
uninterrupted run's."""

from __future__ import annotations

from pathlib import Path

import pytest
from fault_support import CHECKPOINT_EVERY, MAX_STEPS, WRITE_POINTS, kill_and_resume

from gptcore.checkpoint.files import step_name

pytestmark = pytest.mark.slow


def test_five_kills_lose_at_most_two_intervals_each_and_end_bit_for_bit_equal(tmp_path: Path) -> None:
    report = kill_and_resume(tmp_path, seed=6, kills=5)
    kills = report.kills
    assert len(kills) == 5 and {a.kind for a in kills} == {"step", *WRITE_POINTS}
    assert all(a.returncode == -9 for a in kills), [a.returncode for a in kills]
    first, *later = report.attempts
    assert first.start_step == 0
    assert "--resume: no checkpoint in" in first.stderr and "starting from step 0" in first.stderr
    assert all(a.start_step % CHECKPOINT_EVERY == 0 for a in report.attempts), "each started at a checkpoint"
    for killed in kills:  # each died where its kill was placed
        if killed.kind == "step":
            assert killed.last_step == killed.target, killed
        else:  # inside its checkpoint's write: what it was writing left under temporary names
            name = step_name(killed.target)
            writing = [f".{file.format(name=name)}.tmp-{killed.pid}" for file in WRITE_POINTS[killed.kind]]
            assert killed.left == writing, (killed.kind, killed.left)
    resumed = [a for a in later if a.start_step > 0]
    assert resumed, "later runs continue from checkpoints, not from step 0"
    assert not list((tmp_path / "killed").glob(".*.tmp-*")), "no half-written file outlives the series"
    assert any("taking over the run lock left by PID" in a.stderr for a in later)
    # Checkpoints are written in the background: a kill inside a write loses its interval and the steps
    # that ran beside the write, at most one more interval (the next save waits for the write).
    lost = report.work_lost()
    assert max(lost) <= 2 * CHECKPOINT_EVERY, lost
    finish = report.attempts[-1]
    assert finish.kind == "finish" and finish.returncode == 0 and finish.last_step == MAX_STEPS
    assert report.identical, "the killed and resumed run's final weights differ from the uninterrupted run's"
