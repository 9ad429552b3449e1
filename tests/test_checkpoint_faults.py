"""Checkpoint faults: a failing write keeps the previous checkpoint; a damaged one is detected, named and
skipped for the one before it; `--resume` with nothing to resume from says so and starts at step 0."""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch

import gptcore.checkpoint.files as ckpt
from gptcore.checkpoint.record import CheckpointRecord
from gptcore.data.synthetic import synthetic_stream
from gptcore.errors import CheckpointError, DiskFullError
from gptcore.model.config import ModelConfig
from gptcore.runtime.config import RuntimeConfig
from gptcore.tools.fingerprint import sha256_file
from gptcore.train.callbacks import TrainingCallback
from gptcore.train.config import OptimizerConfig, TrainingConfig
from gptcore.train.job import TrainJob
from gptcore.train.records import StartupRecord, StepRecord
from gptcore.train.trainer import train
from tests.disk_full_support import half_then_full, leftovers, snapshot

TINY = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=300)
TRAIN = synthetic_stream(300, 9 * 128, seed=1)


class StopAt(TrainingCallback):
    """Interrupts the run after a given step, like a crash between checkpoints; records the failure."""

    def __init__(self, step: int | None = None) -> None:
        self.step = step
        self.failures: list[str] = []
        self.start: dict[str, Any] = {}

    def on_start(self, startup: StartupRecord) -> None:
        self.start = startup.to_dict()

    def on_step(self, record: StepRecord) -> None:
        if record.step == self.step:
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


@pytest.mark.parametrize("point", [0, 1, 2], ids=["weights", "record", "manifest"])
def test_a_full_disk_keeps_the_previous_checkpoint_intact_and_loadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: int
) -> None:
    interrupted_run(tmp_path, stop_at=5)  # step-2 and step-4 written
    before = snapshot(tmp_path)
    real_write = ckpt.write_atomic
    calls: list[Path] = []

    def filling(target: Path, write: Any, before_rename: Any = None) -> Path:
        calls.append(target)  # the checkpoint's files in order: its .pt, its record, the manifest
        return real_write(target, half_then_full if len(calls) - 1 == point else write, before_rename)

    monkeypatch.setattr(ckpt, "write_atomic", filling)
    events = StopAt()
    with pytest.raises(DiskFullError) as failed:
        train(job(tmp_path, resume=True), events)
    message = str(failed.value)
    assert message.startswith(f"{tmp_path / 'step-00000006.pt'}: no space left on the disk: it needs about ")
    assert f"the previous checkpoint {tmp_path / 'step-00000004.pt'} is kept" in message
    assert message.endswith("free space and resume with --resume") and "\n" not in message
    assert events.failures == [message]
    # Whichever write fills the disk (the manifest's too, after the weights and record are in place), the
    # folder reads as before: no temporary or half file, nothing listed anew, step 6's files removed.
    assert snapshot(tmp_path) == before
    assert leftovers(tmp_path) == []
    monkeypatch.undo()  # space freed: the run resumes and finishes
    train(job(tmp_path, resume=True))
    assert ckpt.load_checkpoint(tmp_path / "final.pt")["step"] == 10


def test_a_write_refused_by_permissions_fails_clearly_and_lists_nothing_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt.save_checkpoint(tmp_path, "step-00000001", {"step": 1}, CheckpointRecord("step", 1))

    def refused(source: Any, target: Any) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(target))

    monkeypatch.setattr(ckpt.os, "replace", refused)
    with pytest.raises(
        CheckpointError, match=r"step-00000002.pt: checkpoint write failed \(Permission denied\)"
    ):
        ckpt.save_checkpoint(tmp_path, "step-00000002", {"step": 2}, CheckpointRecord("step", 2))
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


def _rewrite(path: Path, change: str) -> None:
    """Make `path` fail to load in one way, its record's sha256 updated so the hash still matches."""
    sidecar = path.with_suffix(".json")
    record = json.loads(sidecar.read_text())
    state = torch.load(path, weights_only=True)
    if change == "unpickling":
        state["written"] = datetime.datetime(2026, 12, 3)  # not among the types weights_only loads
    elif change == "wrong shape":
        state["model"]["transformer.wte.weight"] = torch.zeros(3, 3)
    elif change == "missing key":
        del state["optimizer"]
    if change == "older format":
        record["format_version"] = 0
    else:
        torch.save(state, path)
    record["sha256"] = sha256_file(path)
    sidecar.write_text(json.dumps(record))


@pytest.mark.parametrize("change", ["unpickling", "wrong shape", "missing key", "older format"])
def test_a_latest_checkpoint_that_matches_its_hash_but_does_not_load_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, change: str
) -> None:
    train(job(tmp_path / "whole"))
    interrupted_run(tmp_path / "broken", stop_at=7)  # step-4 and step-6 remain
    latest, previous = tmp_path / "broken" / "step-00000006.pt", tmp_path / "broken" / "step-00000004.pt"
    _rewrite(latest, change)
    events = StopAt()
    with caplog.at_level(logging.WARNING):
        train(job(tmp_path / "broken", resume=True), events)
    warning = next(r.getMessage() for r in caplog.records if str(latest) in r.getMessage())
    assert warning.startswith(f"warning: {latest}: ")
    assert warning.endswith(f"resuming from {previous} instead")
    reason = {
        "unpickling": "cannot be loaded (UnpicklingError)",
        "wrong shape": "does not load into this run (RuntimeError: Error(s) in loading state_dict",
        "missing key": "does not load into this run (KeyError: 'optimizer')",
        "older format": "its record is in checkpoint format 0; this gptpipe reads 1",
    }[change]
    assert reason in warning
    assert events.start["start_step"] == 4
    assert same(final_weights(tmp_path / "whole"), final_weights(tmp_path / "broken"))


def test_with_no_checkpoint_that_loads_resume_stops_and_deletes_nothing(tmp_path: Path) -> None:
    interrupted_run(tmp_path, stop_at=5)  # step-2 and step-4
    for path in tmp_path.glob("step-*.pt"):
        _rewrite(path, "missing key")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(CheckpointError) as refused:
        train(job(tmp_path, resume=True))
    message = str(refused.value)
    assert message.startswith(f"{tmp_path}: no intact checkpoint to resume from (nothing was deleted)")
    assert "step-00000004.pt: does not load" in message and "step-00000002.pt: does not load" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_manifest_entries_outside_the_folder_are_neither_pruned_nor_loaded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A planted manifest: an old entry `../victim` (pruning would delete `../victim.pt`) and a newest
    one naming an absolute path (resume would load it). Both are ignored, with a warning each."""
    run = tmp_path / "run"
    interrupted_run(run, stop_at=5)  # step-2 and step-4 remain
    for suffix in (".pt", ".json"):
        (tmp_path / f"victim{suffix}").write_bytes((run / f"step-00000002{suffix}").read_bytes())
    manifest = json.loads((run / "manifest.json").read_text())
    entry = manifest["checkpoints"]["step-00000002"]
    manifest["checkpoints"]["../victim"] = {**entry, "file": "../victim.pt", "step": 1}
    manifest["checkpoints"]["/elsewhere"] = {**entry, "file": str(tmp_path / "victim.pt"), "step": 99}
    (run / "manifest.json").write_text(json.dumps(manifest))
    events = StopAt()
    with caplog.at_level(logging.WARNING):
        train(job(run, resume=True), events)
    assert events.start["resumed_from"].endswith("step-00000004.pt")
    assert (tmp_path / "victim.pt").is_file() and (tmp_path / "victim.json").is_file()
    warnings = [r.getMessage() for r in caplog.records if "names no file of this folder" in r.getMessage()]
    assert any("'../victim'" in w for w in warnings) and any("'/elsewhere'" in w for w in warnings)


def test_a_best_checkpoint_cut_short_between_its_two_files_is_passed_over_for_final(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An older gptpipe killed after `best.pt` was renamed into place and before `best.json` was: the
    pair disagrees. Evaluation takes the newest whole checkpoint and says so, instead of failing on every
    retry (every reader does: tests/test_checkpoint_publish.py)."""
    from tasks.params.loading import PARAMS_DIR, load_params
    from tasks.results import CheckpointsResult
    from tasks.stages.reading import evaluated_checkpoint

    for name, step in (("best", 4), ("final", 6)):
        ckpt.save_checkpoint(
            tmp_path, name, {"model": {"w": torch.ones(2) * step}}, CheckpointRecord(name, step)
        )
    torch.save({"model": {"w": torch.zeros(2)}}, tmp_path / "best.pt")  # the newer best, its record not yet
    params = load_params(PARAMS_DIR / "iteration_1.yaml", [])
    assert params.evaluate.checkpoint == "best"
    chosen = evaluated_checkpoint(params, CheckpointsResult(run_directory=str(tmp_path)))
    assert chosen == tmp_path / "final.pt"
    said = capsys.readouterr().err
    assert "best.pt: checkpoint is corrupted (content sha256 differs from its record); evaluating" in said
