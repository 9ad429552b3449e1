"""Checkpoints: atomic files with a verifiable record, retention, RNG round trips, clear failures."""

from __future__ import annotations

import random
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gptcore.checkpoint import files as ckpt
from gptcore.checkpoint.record import CheckpointRecord
from gptcore.errors import CheckpointError


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((3,), value)}, "rng": ckpt.capture_rng(), "step": int(value)}


def _save(directory: Path, step: int, kind: str = "step", keep: int | None = 2) -> Path:
    name = ckpt.step_name(step) if kind == "step" else kind
    record = CheckpointRecord(kind, step, config={"a": 1}, metadata={"run_id": "r1"})
    clock = iter([100.0, 102.5])  # the save's own clock, scripted: it starts at 100 s and ends at 102.5 s
    with pytest.MonkeyPatch.context() as patch:
        scripted = SimpleNamespace(**{**vars(time), "perf_counter": lambda: next(clock)})  # time, but that
        patch.setattr(ckpt, "time", scripted)
        path, seconds = ckpt.save_checkpoint(directory, name, _state(float(step)), record, keep)
    assert seconds == 2.5, "the seconds a save reports are its end's clock less its start's"
    return path


def test_a_checkpoint_has_a_cheap_record_and_loads_with_weights_only(tmp_path: Path) -> None:
    path = _save(tmp_path, 5)
    record = ckpt.checkpoint_metadata(path)
    assert record.step == 5 and record.metadata == {"run_id": "r1"} and len(record.sha256 or "") == 64
    state = ckpt.load_checkpoint(path)
    assert torch.equal(state["model"]["w"], torch.full((3,), 5.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "manifest.json",
        "step-00000005.json",
        "step-00000005.pt",
    ]


def test_keep_last_prunes_old_periodic_checkpoints_but_not_best_or_final(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        _save(tmp_path, step)
        if step == 2:
            _save(tmp_path, 2, kind="best", keep=None)
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == [
        "best.pt",
        "step-00000003.pt",
        "step-00000004.pt",
    ]
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step-00000004.pt"
    _save(tmp_path, 4, kind="final", keep=None)
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "final.pt"
    assert ckpt.latest_checkpoint(tmp_path / "missing") is None


def test_a_corrupted_checkpoint_is_detected_at_load(tmp_path: Path) -> None:
    path = _save(tmp_path, 1)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted"):
        ckpt.load_checkpoint(path)


def test_a_failing_write_keeps_the_previous_checkpoint_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _save(tmp_path, 1)

    def input_output_error(*args: object, **kwargs: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(torch, "save", input_output_error)
    with pytest.raises(CheckpointError, match=r"write failed \(Input/output error\); the previous"):
        _save(tmp_path, 2)
    monkeypatch.undo()
    assert ckpt.latest_checkpoint(tmp_path) == first
    assert ckpt.load_checkpoint(first)["step"] == 1
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_rng_states_round_trip_through_a_checkpoint(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    path = _save(tmp_path, 1)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    ckpt.restore_rng(ckpt.load_checkpoint(path)["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_config_differences_name_each_differing_key() -> None:
    differences = ckpt.config_differences({"lr": 1.0, "seed": 1, "old": 2}, {"lr": 2.0, "seed": 1, "new": 3})
    assert differences == ["lr: 1.0 -> 2.0", "new: None -> 3", "old: 2 -> None"]


def test_a_model_read_while_its_checkpoint_is_published_again_comes_with_its_own_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training publishes `best` again while an export or generate reads it (held here right after the
    reader first looked at the record): the weights and the record returned are one checkpoint's, never
    the old record (its step, its model card's figures) with the new weights."""
    from gptcore.checkpoint.load import load_model
    from gptcore.model.config import ModelConfig
    from gptcore.model.gpt import GPT

    config = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=260)
    models = {step: GPT(config) for step in (100, 200)}  # two trainings' weights: different at random

    def publish(step: int) -> None:
        record = CheckpointRecord("best", step, config={"a": 1}, model_config=config)
        ckpt.save_checkpoint(tmp_path, "best", {"model": models[step].state_dict()}, record, None)

    publish(100)
    read_record = ckpt.checkpoint_metadata

    def newer_best_meanwhile(path: Path) -> CheckpointRecord:
        record = read_record(path)
        monkeypatch.setattr(ckpt, "checkpoint_metadata", read_record)  # once
        publish(200)
        return record

    monkeypatch.setattr(ckpt, "checkpoint_metadata", newer_best_meanwhile)
    model, record = load_model(tmp_path / "best.pt")
    loaded = model.state_dict()
    assert record.step == 200 and all(torch.equal(loaded[k], v) for k, v in models[200].state_dict().items())
