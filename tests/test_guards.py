"""The non-finite guard: fp16 skips overflowed steps until too many in a row; fp32/bf16 stop at once."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

import gptcore.train.step as step_module
from gptcore.checkpoint.files import latest_checkpoint, load_checkpoint
from gptcore.data.synthetic import synthetic_stream
from gptcore.errors import TrainingError
from gptcore.model.config import ModelConfig
from gptcore.runtime.config import RuntimeConfig
from gptcore.train.callbacks import TrainingCallback
from gptcore.train.config import OptimizerConfig, TrainingConfig
from gptcore.train.guards import NonFiniteGuard
from gptcore.train.job import TrainJob
from gptcore.train.records import StepRecord
from gptcore.train.trainer import train

TINY = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=300)
TRAIN = synthetic_stream(300, 9 * 128, seed=1)


class Recorder(TrainingCallback):
    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.failures: list[str] = []
        self.checkpoints: list[int] = []

    def on_step(self, record: StepRecord) -> None:
        self.steps.append(record.to_dict())

    def on_checkpoint(self, path: Path, info: dict[str, Any]) -> None:
        self.checkpoints.append(info["step"])

    def on_failure(self, reason: str) -> None:
        self.failures.append(reason)


def poison_steps(monkeypatch: pytest.MonkeyPatch, steps: set[int], value: float) -> None:
    """Make the gradients (and the loss) of the given 1-based optimizer steps `value` (nan or inf)."""
    original = step_module.accumulate_gradients
    calls = {"step": 0}

    def poisoned(forward: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        total = original(forward, *args, **kwargs)
        calls["step"] += 1
        if calls["step"] not in steps:
            return total
        for parameter in forward.parameters():
            if parameter.grad is not None:
                parameter.grad.fill_(value)
        return total * value

    monkeypatch.setattr(step_module, "accumulate_gradients", poisoned)


def job(tmp_path: Path, precision: str = "fp32", **training: Any) -> TrainJob:
    settings = dict(
        max_steps=10,
        log_every=3,
        eval_every=100,
        checkpoint_every=2,
        optimizer=OptimizerConfig(warmup_steps=1),
    )
    settings.update(training)
    return TrainJob(
        model=TINY,
        runtime=RuntimeConfig(device="cpu", precision=precision, batch_size=4),
        training=TrainingConfig(**settings),
        train_tokens=TRAIN,
        checkpoint_directory=tmp_path,
    )


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_fp32_stops_at_the_first_non_finite_step_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: float
) -> None:
    poison_steps(monkeypatch, {5}, value)  # step 5 is not a log step: the guard, not logging, sees it
    events = Recorder()
    with pytest.raises(TrainingError) as stopped:
        train(job(tmp_path), events)
    message = str(stopped.value)
    assert message.startswith("non-finite loss at step 5 in fp32")
    assert "step-00000004.pt is kept" in message and "\n" not in message
    assert events.failures == [message], "the tracking callback learns the reason (MLflow run FAILED)"
    assert events.checkpoints == [2, 4], "nothing written after the bad step"
    assert [m["step"] for m in events.steps] == [3]
    kept = latest_checkpoint(tmp_path)
    assert kept is not None and kept.name == "step-00000004.pt"
    weights = load_checkpoint(kept)["model"]
    assert all(torch.isfinite(tensor).all() for tensor in weights.values())


def test_bf16_stops_too_and_says_no_checkpoint_was_written_when_none_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    poison_steps(monkeypatch, {1}, math.nan)
    with pytest.raises(TrainingError, match=r"at step 1 in bf16 .*no checkpoint had been written yet"):
        train(job(tmp_path, "bf16"))


def test_fp16_skips_an_overflowed_step_and_trains_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    poison_steps(monkeypatch, {3}, math.inf)  # step 3 is a log step: its inf loss must not reach the log
    events = Recorder()
    summary = train(job(tmp_path, "fp16"), events)
    assert summary.steps == 10 and not events.failures
    assert all(math.isfinite(m["train_loss"]) for m in events.steps)


def test_fp16_stops_after_the_configured_number_of_consecutive_skips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    poison_steps(monkeypatch, set(range(4, 11)), math.inf)
    events = Recorder()
    with pytest.raises(TrainingError) as stopped:
        train(job(tmp_path, "fp16", max_skipped_steps=3), events)
    assert str(stopped.value).startswith("fp16: 3 consecutive steps up to step 6 had non-finite gradients")
    assert "step-00000004.pt is kept" in str(stopped.value)
    assert events.failures == [str(stopped.value)]


def test_a_late_verdict_waits_for_the_next_step_or_a_settle() -> None:
    guard = NonFiniteGuard("fp32", immediate=False)
    guard.observe(1, torch.tensor(2.0), torch.tensor(1.0))
    guard.observe(2, torch.tensor(math.nan), torch.tensor(1.0))  # queued, not yet read
    with pytest.raises(TrainingError, match="non-finite loss at step 2"):
        guard.settle()
    guard.observe(3, torch.tensor(1.0), torch.tensor(math.inf))
    with pytest.raises(TrainingError, match="non-finite gradient norm at step 3"):
        guard.observe(4, torch.tensor(1.0), torch.tensor(1.0))


def test_skip_counting_resets_on_a_step_the_scaler_took() -> None:
    scales = iter([1024.0, 512.0, 512.0, 512.0, 512.0, 256.0, 256.0, 128.0])  # before and after each step
    guard = NonFiniteGuard("fp16", scale=lambda: next(scales), max_skipped_steps=2)

    def step(index: int) -> bool:
        guard.before_update()
        return guard.observe(index, torch.tensor(math.inf), None)  # the scaler decides, not the loss

    assert not step(1)
    assert step(2)
    assert not step(3)
    assert guard.consecutive_skips == 1 and guard.skipped_steps == 2
    with pytest.raises(TrainingError, match="2 consecutive steps up to step 4"):
        step(4)


def test_a_non_finite_mean_loss_stops_the_run_naming_the_checkpoint_kept() -> None:
    guard = NonFiniteGuard("bf16")
    guard.check_train_loss(10, 3.2)
    guard.last_checkpoint = "run/step-00000008.pt"
    with pytest.raises(TrainingError, match=r"training loss is nan at step 12; stopped; the last good "):
        guard.check_train_loss(12, math.nan)


def test_ranks_agree_a_rank_that_saw_nothing_stops_with_the_one_that_did() -> None:
    guard = NonFiniteGuard("fp32", agree=lambda flag: flag + 1)  # "another rank"
    with pytest.raises(TrainingError, match="on another rank"):
        guard.observe(7, torch.tensor(1.0), torch.tensor(1.0))
