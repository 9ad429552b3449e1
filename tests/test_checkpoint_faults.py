"""Checkpoint faults: a failing write keeps the previous checkpoint; a damaged one is detected, named and
skipped for the one before it; `--resume` with nothing to resume from says so and starts at step 0."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch

import gptcore.checkpoint as ckpt
from gptcore.callbacks import TrainingCallback
from gptcore.config import ModelConfig, OptimizerConfig, RuntimeConfig, TrainingConfig
from gptcore.errors import CheckpointError
from gptcore.synthetic import synthetic_stream
from gptcore.trainer import TrainJob, train

TINY = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=300)
TRAIN = synthetic_stream(300, 9 * 128, seed=1)


class StopAt(TrainingCallback):
    """Interrupts the run after a given step, like a crash between checkpoints; records the failure."""

    def __init__(self, step: int | None = None) -> None:
        self.step = step
        self.failures: list[str] = []
        self.start: dict[str, Any] = {}

    def on_start(self, startup: dict[str, Any]) -> None:
        self.start = startup

    def on_step(self, metrics: dict[str, Any]) -> None:
        if metrics["step"] == self.step:
            raise KeyboardInterrupt

    def on_failure(self, reason: str) -> None:
        self.failures.append(reason)


def job(directory: Path, resume: bool = False, **training: Any) -> TrainJob:
    settings = dict(
        max_steps=10,
        log_every=1,
        eval_every=100,
        checkpoint_every=2,
        keep_last=2,
        optimizer=OptimizerConfig(warmup_steps=1),
    )
    settings.update(training)
    return TrainJob(
        model=TINY,
        runtime=RuntimeConfig(device="cpu", precision="fp32", batch_size=4),
        training=TrainingConfig(**settings),
        train_tokens=TRAIN,
        checkpoint_directory=directory,
        resume=resume,
    )


def interrupted_run(directory: Path, stop_at: int = 7) -> None:
    with pytest.raises(KeyboardInterrupt):
        train(job(directory), StopAt(stop_at))


def final_weights(directory: Path) -> dict[str, torch.Tensor]:
    return ckpt.load_checkpoint(directory / "final.pt")["model"]


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _no_space(*args: Any, **kwargs: Any) -> None:
    handle = args[1]
    handle.write(b"half a checkpoint")  # some bytes reach the disk before it fills
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_keeps_the_previous_checkpoint_intact_and_loadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    interrupted_run(tmp_path, stop_at=5)  # step-2 and step-4 written
    before = sorted(p.name for p in tmp_path.iterdir())
    manifest = (tmp_path / "manifest.json").read_bytes()
    monkeypatch.setattr(ckpt.torch, "save", _no_space)
    events = StopAt()
    with pytest.raises(CheckpointError) as failed:
        train(job(tmp_path, resume=True), events)
    message = str(failed.value)
    assert message.endswith(
        "checkpoint write failed (No space left on device); the previous checkpoint is kept"
    )
    assert "step-00000006.pt" in message and "\n" not in message
    assert events.failures == [message]
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "no temporary or half file left"
    assert (tmp_path / "manifest.json").read_bytes() == manifest
    monkeypatch.undo()
    path, record, state = ckpt.load_latest_valid(tmp_path)
    assert path.name == "step-00000004.pt" and record["step"] == state["step"] == 4


def test_a_write_refused_by_permissions_fails_clearly_and_lists_nothing_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt.save_checkpoint(tmp_path, "step-00000001", {"step": 1}, {"kind": "step", "step": 1})

    def refused(source: Any, target: Any) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(target))

    monkeypatch.setattr(ckpt.os, "replace", refused)
    with pytest.raises(
        CheckpointError, match=r"step-00000002.pt: checkpoint write failed \(Permission denied\)"
    ):
        ckpt.save_checkpoint(tmp_path, "step-00000002", {"step": 2}, {"kind": "step", "step": 2})
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "manifest.json",
        "step-00000001.json",
        "step-00000001.pt",
    ]
    assert ckpt.latest_checkpoint(tmp_path).name == "step-00000001.pt"


@pytest.mark.parametrize("damage", ["truncated", "flipped byte"])
def test_a_damaged_latest_checkpoint_is_named_and_the_one_before_it_resumes_exactly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    train(job(tmp_path / "whole"))
    interrupted_run(tmp_path / "broken", stop_at=7)  # keep_last 2: step-4 and step-6 remain
    latest = tmp_path / "broken" / "step-00000006.pt"
    data = bytearray(latest.read_bytes())
    if damage == "truncated":
        del data[len(data) // 2 :]
    else:
        data[len(data) // 2] ^= 0xFF
    latest.write_bytes(bytes(data))
    events = StopAt()
    with caplog.at_level(logging.WARNING):
        train(job(tmp_path / "broken", resume=True), events)
    warning = next(r.getMessage() for r in caplog.records if "corrupted" in r.getMessage())
    assert f"{latest}: checkpoint is corrupted (content sha256 differs from its record)" in warning
    assert events.start["start_step"] == 4 and events.start["resumed_from"].endswith("step-00000004.pt")
    assert same(final_weights(tmp_path / "whole"), final_weights(tmp_path / "broken"))


def test_when_every_checkpoint_is_damaged_resume_refuses_rather_than_restart(tmp_path: Path) -> None:
    interrupted_run(tmp_path, stop_at=5)
    for path in tmp_path.glob("step-*.pt"):
        path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="no intact checkpoint to resume from"):
        train(job(tmp_path, resume=True))


def test_a_missing_record_counts_as_damage_too(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    interrupted_run(tmp_path, stop_at=5)
    (tmp_path / "step-00000004.json").unlink()
    with caplog.at_level(logging.WARNING):
        path, _, state = ckpt.load_latest_valid(tmp_path)
    assert path.name == "step-00000002.pt" and state["step"] == 2
    assert any("no checkpoint record step-00000004.json" in r.getMessage() for r in caplog.records)


def test_resume_with_no_checkpoint_yet_starts_at_step_zero_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    events = StopAt()
    with caplog.at_level(logging.WARNING):
        train(job(tmp_path / "fresh", resume=True, max_steps=2), events)
    assert events.start["start_step"] == 0 and events.start["resumed_from"] is None
    assert any(
        r.getMessage()
        == f"warning: --resume: no checkpoint in {tmp_path / 'fresh'} yet; starting from step 0"
        for r in caplog.records
    )


def test_a_run_clears_the_half_written_files_a_killed_writer_left(tmp_path: Path) -> None:
    interrupted_run(tmp_path, stop_at=3)
    stale = tmp_path / ".step-00000004.pt.tmp-999999"
    stale.write_bytes(b"half a checkpoint")
    train(job(tmp_path, resume=True))
    assert not stale.exists()
    assert ckpt.latest_checkpoint(tmp_path).name == "final.pt"
