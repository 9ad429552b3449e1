"""`kill -9` at seeded random moments of a CPU fp32 run, checkpoint writes included: each `--resume`
continues from the last complete checkpoint, and the final weights equal an uninterrupted run's."""

from __future__ import annotations

from pathlib import Path

import pytest
from fault_support import CHECKPOINT_EVERY, MAX_STEPS, kill_and_resume

pytestmark = pytest.mark.slow


def test_five_kills_lose_at_most_two_intervals_each_and_end_bit_for_bit_equal(tmp_path: Path) -> None:
    report = kill_and_resume(tmp_path, seed=6, kills=5)
    kills = report.kills
    assert len(kills) == 5 and {a.kind for a in kills} == {"step", "write"}
    assert all(a.returncode == -9 for a in kills), [a.returncode for a in kills]
    first, *later = report.attempts
    assert first.start_step == 0
    assert "--resume: no checkpoint in" in first.stderr and "starting from step 0" in first.stderr
    resumed = [a for a in later if a.start_step > 0]
    assert resumed, "later runs continue from checkpoints, not from step 0"
    assert all(a.start_step >= 0 for a in report.attempts), "every run got as far as its startup line"
    assert all(a.start_step % CHECKPOINT_EVERY == 0 for a in report.attempts)
    assert not list((tmp_path / "killed").glob(".*.tmp-*")), "no half-written file outlives the series"
    assert any("taking over the run lock left by PID" in a.stderr for a in later)
    # Checkpoints are written in the background: a kill inside a write loses its interval and the steps
    # that ran beside the write, at most one more interval (the next save waits for the write).
    lost = report.work_lost()
    assert max(lost) <= 2 * CHECKPOINT_EVERY, lost
    finish = report.attempts[-1]
    assert finish.kind == "finish" and finish.returncode == 0 and finish.last_step == MAX_STEPS
    assert report.identical, "the killed and resumed run's final weights differ from the uninterrupted run's"
