"""The batch a run trains with: configured, the largest that fits (probed or estimated), the accumulation
that keeps an effective batch, and the smaller batch to try after running out of memory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from gptcore.data.synthetic import synthetic_stream
from gptcore.errors import ConfigError, TrainingError
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT
from gptcore.runtime.batch_size import (
    MARGIN,
    OutOfMemory,
    accumulation,
    estimated_choice,
    largest_fitting,
    probe_step,
    probed_choice,
)
from gptcore.runtime.config import RuntimeConfig
from gptcore.runtime.memory import StepMemory
from gptcore.train.callbacks import TrainingCallback
from gptcore.train.config import TrainingConfig
from gptcore.train.job import TrainJob
from gptcore.train.records import StartupRecord
from gptcore.train.trainer import train

TINY = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=300)


class StartupCapture(TrainingCallback):
    def __init__(self) -> None:
        self.startup: dict[str, Any] = {}

    def on_start(self, startup: StartupRecord) -> None:
        self.startup = startup.to_dict()


def out_of_memory_above(limit: int, calls: list[int]) -> Callable[[int], None]:
    """A stand-in training step that runs out of memory above `limit` samples."""

    def step(size: int) -> None:
        calls.append(size)
        if size > limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory at batch {size}")

    return step


def test_the_search_doubles_then_bisects_to_the_largest_that_fits() -> None:
    largest, tried = largest_fitting(lambda size: size <= 37)
    assert largest == 37
    assert [size for size, _ in tried][:7] == [1, 2, 4, 8, 16, 32, 64]  # doubling until one fails
    assert tried[6] == [64, False] and all(ok == (size <= 37) for size, ok in tried)
    assert largest_fitting(lambda size: False) == (0, [[1, False]])
    assert largest_fitting(lambda size: True, limit=100)[0] == 100  # the cap, when memory never runs out


def test_the_probe_keeps_a_ten_percent_margin_below_the_largest_batch_that_ran() -> None:
    calls: list[int] = []
    choice = probed_choice(out_of_memory_above(100, calls))
    assert choice.source == "probed" and choice.figures["largest_that_ran"] == 100
    assert choice.batch_size == int(100 * (1 - MARGIN)) == 90 and choice.grad_accum_steps == 1
    assert 128 in calls and 101 in calls and max(calls) == 128  # doubled past it, then bisected


def test_an_effective_batch_takes_a_divisor_and_the_accumulation_makes_up_the_rest() -> None:
    choice = probed_choice(out_of_memory_above(100, []), effective=256)
    assert (choice.batch_size, choice.grad_accum_steps) == (64, 4)  # the largest divisor of 256 under 90
    on_two_ranks = probed_choice(out_of_memory_above(100, []), effective=256, world_size=2)
    assert (on_two_ranks.batch_size, on_two_ranks.grad_accum_steps) == (64, 2)


def test_the_probe_passes_other_errors_through_and_says_when_nothing_fits() -> None:
    def broken(size: int) -> None:
        raise RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED")

    with pytest.raises(RuntimeError, match="CUBLAS"):
        probed_choice(broken)
    with pytest.raises(TrainingError, match="batch size 1 runs out of memory"):
        probed_choice(out_of_memory_above(0, []))


def test_the_estimated_batch_is_the_largest_whose_estimate_fits_the_budget() -> None:
    budget = 200 * 2**20
    memory = StepMemory(TINY, 100_000)
    choice = estimated_choice(memory, budget)
    estimate = memory.total

    usable = budget * (1 - MARGIN)
    assert choice.source == "estimated" and choice.figures["budget_bytes"] == budget
    assert estimate(choice.batch_size) <= usable < estimate(choice.batch_size + 1)
    with pytest.raises(TrainingError, match=r"batch size 1 fits on cpu .*: use --activation-checkpointing"):
        estimated_choice(memory, 1 << 20)


def test_a_probe_step_leaves_no_trace() -> None:
    model = GPT(TINY)
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    state = torch.random.get_rng_state()
    step = probe_step(model, TINY, "cpu", lambda: torch.autocast("cpu", enabled=False), reserve=1 << 20)
    step(4)
    assert torch.equal(torch.random.get_rng_state(), state)  # the training's random stream is untouched
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, weights[name]) for name, p in model.named_parameters())


def test_a_run_with_batch_size_auto_records_how_it_was_decided() -> None:
    job = TrainJob(
        model=TINY,
        runtime=RuntimeConfig(device="cpu", precision="fp32", batch_size="auto", effective_batch_size=64),
        training=TrainingConfig(max_steps=2, log_every=1, eval_every=100, eval_at_start=False),
        train_tokens=synthetic_stream(300, 17 * 400, seed=1),
    )
    capture = StartupCapture()
    train(job, capture)
    startup = capture.startup
    assert startup["batch_size_source"] == "estimated" and startup["effective_batch_target"] == 64
    assert startup["batch_size"] * startup["grad_accum_steps"] == startup["global_batch"] == 64
    assert startup["batch_probe"]["largest_fitting"] >= startup["batch_size"]


def test_an_effective_batch_that_the_batch_does_not_divide_is_refused_by_the_parameters() -> None:
    with pytest.raises(ValueError, match=r"effective_batch_size 10 is not a multiple of runtime\.batch_size"):
        RuntimeConfig(batch_size=4, effective_batch_size=10)


def test_after_running_out_of_memory_the_estimate_names_a_smaller_batch_that_fits() -> None:
    def estimate(size: int, accum: int) -> int:
        return size * 2**30  # a GiB a sample

    response = OutOfMemory("cuda", 32, 2, 1, 1024, estimate, budget=20 * 2**30)
    assert response.smaller_batch() == (16, 4, "the largest smaller batch whose estimate fits")
    wrong_estimate = OutOfMemory("cuda", 8, 1, 1, 1024, estimate, budget=20 * 2**30)
    assert wrong_estimate.smaller_batch() == (4, 2, "half the batch")  # the estimate said 8 fit: halve
    message = response.response(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), None)
    assert message.startswith("out of memory on cuda at batch size 32, sequence length 1024 (GPU memory")
    assert "try --batch-size 16 --grad-accum 4" in message and "no checkpoint had been written yet" in message


def test_configured_batches_check_the_effective_batch_too() -> None:
    assert accumulation(12, 3, 2, 1) == 2 and accumulation(None, 3, 2, 5) == 5
    with pytest.raises(ConfigError, match="not a multiple of batch size 3 x 2 ranks"):
        accumulation(15, 3, 2, 1)
