"""Memory: the training's own measured peak, the estimate's terms, activation checkpointing."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gptcore.data.synthetic import synthetic_stream
from gptcore.model import gpt as model_module
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT
from gptcore.runtime import malloc as host_memory
from gptcore.runtime import memory as memory_module
from gptcore.runtime.config import RuntimeConfig
from gptcore.runtime.memory import StepMemory
from gptcore.train.callbacks import TrainingCallback
from gptcore.train.config import OptimizerConfig, TrainingConfig
from gptcore.train.job import TrainJob
from gptcore.train.records import StartupRecord, StepRecord
from gptcore.train.trainer import train
from tasks.params.loading import load_profile

TINY = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=300)
TRAIN = synthetic_stream(300, 17 * 200, seed=1)


@pytest.fixture
def heap_restored() -> Iterator[None]:
    """Activation checkpointing switches this process's heap to hand large arrays back (slower steps);
    the rest of the suite runs with the heap it had."""
    state = host_memory._state
    yield
    host_memory._mallopt(host_memory._M_MMAP_THRESHOLD, host_memory.MMAP_THRESHOLD_BYTES)
    host_memory._mallopt(host_memory._M_TRIM_THRESHOLD, host_memory.TRIM_THRESHOLD_BYTES)
    host_memory._state = state


class Losses(TrainingCallback):
    def __init__(self) -> None:
        self.steps: list[float] = []
        self.startup: dict[str, Any] = {}

    def on_start(self, startup: StartupRecord) -> None:
        self.startup = startup.to_dict()

    def on_step(self, record: StepRecord) -> None:
        self.steps.append(record.train_loss)

    @classmethod
    def of(cls, job: TrainJob) -> tuple[list[float], dict[str, Any]]:
        """The training losses of a run of `job`, and its startup record."""
        losses = cls()
        train(job, losses)
        return losses.steps, losses.startup


def tiny_job(steps: int = 5, **runtime: object) -> TrainJob:
    return TrainJob(
        model=TINY,
        runtime=RuntimeConfig(device="cpu", precision="fp32", batch_size=8, grad_accum_steps=1, **runtime),
        training=TrainingConfig(
            max_steps=steps,
            log_every=1,
            eval_every=1000,
            eval_at_start=False,
            optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=1),
        ),
        train_tokens=TRAIN,
    )


def test_the_training_peak_is_its_own_not_the_processes() -> None:
    summary = train(tiny_job())
    assert 0 < summary.training_peak_memory_bytes < summary.peak_memory_bytes
    assert "VmHWM" in summary.training_peak_memory_source


def test_where_the_peak_cannot_be_reset_the_record_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory_module, "_CLEAR_REFS", tmp_path / "no-proc" / "clear_refs")
    summary = train(tiny_job(steps=2))
    assert summary.training_peak_memory_bytes is None
    assert summary.training_peak_memory_source.startswith("unavailable on cpu")
    assert summary.peak_memory_bytes > 0  # the process's peak is still known


def test_activation_checkpointing_trains_to_the_same_losses(
    monkeypatch: pytest.MonkeyPatch, heap_restored: None
) -> None:
    monkeypatch.setattr(model_module, "LOSS_CHUNK_TOKENS", 40)  # 128 tokens a step: four loss pieces

    plain, plain_startup = Losses.of(tiny_job())
    recomputed, startup = Losses.of(tiny_job(activation_checkpointing=True))
    assert len(plain) == len(recomputed) == 5
    assert max(abs(a - b) for a, b in zip(plain, recomputed, strict=True)) < 1e-6
    assert startup["activation_checkpointing"] and not plain_startup["activation_checkpointing"]
    assert startup["estimated_peak_memory_bytes"] < plain_startup["estimated_peak_memory_bytes"]
    if sys.platform.startswith("linux"):  # glibc: the heap hands large arrays back
        assert startup["host_allocator"].startswith(host_memory.LEAN)


def test_a_model_with_activation_checkpointing_returns_the_loss_without_whole_logits() -> None:
    model = GPT(TINY)
    tokens = torch.randint(0, 300, (2, 16))
    loss = model(tokens, tokens)[1]
    model.activation_checkpointing = True
    none, recomputed = model(tokens, tokens)
    assert none is None and torch.allclose(loss, recomputed, atol=1e-6)
    with torch.no_grad():  # evaluation and generation are untouched
        assert model(tokens, tokens)[0] is not None


def test_the_estimate_counts_what_activation_checkpointing_keeps() -> None:
    config = load_profile("gpt_42m").architecture
    parameters = 41_938_560
    plain = StepMemory(config, parameters).estimate(2)
    lean = StepMemory(config, parameters, activation_checkpointing=True).estimate(2)
    assert lean["weights"] == plain["weights"] and lean["optimizer"] == plain["optimizer"]
    assert lean["activations"] < plain["activations"] / 4
    assert lean["logits"] == model_module.LOSS_CHUNK_TOKENS * config.vocab_size * 8  # one piece, fp32
    assert lean["total"] < 0.6 * plain["total"]


def test_the_estimate_has_a_host_allocator_share_on_cpu_only_and_grows_with_the_batch() -> None:
    config = load_profile("gpt_first_cpu").architecture
    on_cpu = StepMemory(config, 5_322_240, device="cpu")
    cpu, cuda = on_cpu.estimate(8), StepMemory(config, 5_322_240, device="cuda").estimate(8)
    assert cpu["host_allocator"] > 0 and cuda["host_allocator"] == 0
    assert cuda["total"] == cpu["total"] - cpu["host_allocator"]
    assert on_cpu.total(16) > cpu["total"]
    assert on_cpu.total(8, grad_accum_steps=2) > cpu["total"]  # gradients alive through the next forward


def test_a_checkpoint_snapshot_counts_on_the_host_and_can_be_the_peak() -> None:
    config = load_profile("gpt_100m").architecture
    parameters = 98_425_344
    plain = StepMemory(config, parameters).estimate(1)
    snapshotting = StepMemory(config, parameters, checkpoint_snapshot=True).estimate(1)
    assert snapshotting["checkpoint_snapshot"] == 12 * parameters  # weights and moments, fp32
    assert snapshotting["total"] > plain["total"]  # at batch 1 the snapshot outweighs the activations
    on_gpu = StepMemory(config, parameters, device="cuda", checkpoint_snapshot=True).estimate(1)
    assert on_gpu["checkpoint_snapshot"] == 0  # it lives in host memory
