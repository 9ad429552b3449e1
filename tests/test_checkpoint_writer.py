"""Checkpoints written in the background: the loop does not wait for the disk, one write is in flight at
most, a failed write comes back on the training thread, and the files hold the state of their step."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

import gptcore.checkpoint.files as ckpt
from gptcore.checkpoint.writer import CheckpointWriter, Written, snapshot
from gptcore.errors import DiskFullError
from gptcore.train.records import SummaryRecord
from gptcore.train.trainer import train
from tests.test_checkpoint_faults import job


def held_write(release: threading.Event, started: threading.Event, step: int) -> Written:
    started.set()
    release.wait(timeout=30)
    return Written(Path(f"step-{step}.pt"), "step", step, 0.0)


def test_a_save_returns_while_its_write_runs_and_the_next_waits_for_it() -> None:
    writer = CheckpointWriter()
    release, started = threading.Event(), threading.Event()
    writer.submit(lambda: held_write(release, started, 2))
    assert started.wait(timeout=10) and writer.busy  # returned with the write still running
    second_started = threading.Event()
    second = threading.Thread(target=writer.submit, args=(lambda: held_write(release, second_started, 4),))
    second.start()
    second.join(timeout=0.5)
    assert second.is_alive() and not second_started.is_set(), "one write in flight at most"
    release.set()
    second.join(timeout=10)
    writer.close()
    assert [written.step for written in writer.finished()] == [2, 4]


def test_a_failed_write_is_raised_on_the_training_thread() -> None:
    writer = CheckpointWriter()

    def full() -> Written:
        raise DiskFullError("step-2.pt: no space left on the disk")

    writer.submit(full)
    with pytest.raises(DiskFullError, match="no space left"):
        writer.wait()
    writer.submit(full)
    writer.close(raise_errors=False)  # on the way out of a failed run: logged, not raised
    assert writer.finished() == []


def test_a_snapshot_is_a_copy_the_next_step_cannot_change() -> None:
    weights = torch.ones(3)
    state = {"model": {"w": weights}, "step": 2, "rng": [torch.zeros(2)]}
    copied = snapshot(state)
    weights.add_(1.0)
    assert torch.equal(copied["model"]["w"], torch.ones(3)) and copied["step"] == 2
    assert copied["rng"][0] is not state["rng"][0]


def run(directory: Path, background: bool) -> SummaryRecord:
    return train(job(directory, max_steps=8, log_every=4, keep_last=10, async_checkpoints=background))


def test_background_checkpoints_hold_exactly_what_synchronous_ones_do(tmp_path: Path) -> None:
    summary = run(tmp_path / "background", background=True)
    run(tmp_path / "sync", background=False)
    assert summary.final_checkpoint == str(tmp_path / "background" / "final.pt")  # on disk at return
    for name in ("step-00000002", "step-00000004", "step-00000006", "final"):
        written = ckpt.load_checkpoint(tmp_path / "background" / f"{name}.pt")
        reference = ckpt.load_checkpoint(tmp_path / "sync" / f"{name}.pt")
        assert written["step"] == reference["step"]
        assert all(torch.equal(written["model"][k], reference["model"][k]) for k in reference["model"])
        moments = written["optimizer"]["state"][0]["exp_avg"], reference["optimizer"]["state"][0]["exp_avg"]
        assert torch.equal(*moments)
    assert summary.checkpoint_stall_seconds >= 0 and summary.checkpoint_save_seconds > 0
