"""Checkpoints written in the background: the loop does not wait for the disk, one write is in flight at
most, a failed write comes back on the training thread, and the files hold the state of their step."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from waiting import until

import gptcore.checkpoint.files as ckpt
from gptcore.checkpoint.writer import CheckpointWriter, Written, snapshot
from gptcore.errors import DiskFullError
from gptcore.train.callbacks import CheckpointInfo, TrainingCallback
from gptcore.train.records import SummaryRecord
from gptcore.train.trainer import train
from tests.test_checkpoint_faults import job


def held_write(release: threading.Event, started: threading.Event, step: int) -> Written:
    started.set()
    release.wait(timeout=120)  # the test releases it; the ceiling only ends a hang when it fails first
    return Written(Path(f"step-{step}.pt"), "step", step, 0.0)


def test_a_save_returns_while_its_write_runs_and_the_next_waits_for_it() -> None:
    writer = CheckpointWriter()
    release, started = threading.Event(), threading.Event()
    writer.submit(lambda: held_write(release, started, 2))
    assert started.wait(timeout=120) and writer.busy  # returned with the write still running
    waiting, wait = threading.Event(), writer.wait

    def waits_for_the_write_in_flight() -> float:
        waiting.set()  # the second save has come to the first write, which the test still holds
        return wait()

    writer.wait = waits_for_the_write_in_flight  # type: ignore[method-assign]
    second_started = threading.Event()
    second = threading.Thread(target=writer.submit, args=(lambda: held_write(release, second_started, 4),))
    second.start()
    until(waiting.is_set, "the second save waits for the write in flight")
    assert second.is_alive() and not second_started.is_set(), "one write in flight at most"
    release.set()
    second.join(timeout=120)
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


class Writes(TrainingCallback):
    """The seconds each checkpoint's write took, as the run reports it when the write is complete."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}

    def on_checkpoint(self, path: Path, info: CheckpointInfo) -> None:
        self.seconds[info["step"]] = info["seconds"]


def run(directory: Path, background: bool, writes: Writes | None = None) -> SummaryRecord:
    settings = job(directory, max_steps=8, log_every=4, keep_last=10, async_checkpoints=background)
    return train(settings, writes or Writes())


def test_background_checkpoints_hold_exactly_what_synchronous_ones_do(tmp_path: Path) -> None:
    background, sync = Writes(), Writes()
    summary = run(tmp_path / "background", background=True, writes=background)
    synchronous = run(tmp_path / "sync", background=False, writes=sync)
    assert summary.final_checkpoint == str(tmp_path / "background" / "final.pt")  # on disk at return
    for name in ("step-00000002", "step-00000004", "step-00000006", "final"):
        written = ckpt.load_checkpoint(tmp_path / "background" / f"{name}.pt")
        reference = ckpt.load_checkpoint(tmp_path / "sync" / f"{name}.pt")
        assert written["step"] == reference["step"]
        assert all(torch.equal(written["model"][k], reference["model"][k]) for k in reference["model"])
        moments = written["optimizer"]["state"][0]["exp_avg"], reference["optimizer"]["state"][0]["exp_avg"]
        assert torch.equal(*moments)
    # The figures are the sums of their parts: every write's own seconds (steps 2, 4, 6 and the final 8),
    # of which a synchronous run's loop waited through all (each write inside its stall) and a background
    # run's through what it waited for a write in flight, plus its snapshots.
    for figures, writes in ((summary, background), (synchronous, sync)):
        assert sorted(writes.seconds) == [2, 4, 6, 8] and figures.checkpoint_saves == 4
        assert figures.checkpoint_save_seconds == pytest.approx(sum(writes.seconds.values()), rel=1e-9)
        assert figures.checkpoint_wait_seconds <= figures.checkpoint_stall_seconds
    assert synchronous.checkpoint_stall_seconds >= synchronous.checkpoint_save_seconds
