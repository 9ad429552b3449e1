"""The batch a run trains with: as configured, or (`runtime.batch_size: auto`) the largest that fits;
and after a step ran out of memory, the smaller batch to try.

On CUDA the largest batch is probed: real forward and backward passes (with room for AdamW's moments
held) at doubling batch sizes until one runs out of memory, a bisection between the last that ran and
the first that did not, then a 10% margin. Elsewhere it is the largest whose estimate
(`gptcore.runtime.memory.estimate_memory`) fits 90% of the memory available. With a target effective batch
(`runtime.effective_batch_size`) the batch is a divisor of it and the accumulation makes up the rest,
so the optimizer sees the same batch and the learning-rate schedule is unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import torch

from gptcore.errors import ConfigError, TrainingError, first_line
from gptcore.model.config import ModelConfig
from gptcore.runtime.decided import Runtime
from gptcore.runtime.memory import StepMemory, is_out_of_memory

# How `auto` decided, by name: the sizes tried (each with whether it fit), the largest that ran or fit,
# the budget and margin, the estimate of the size chosen.
ProbeFigures = dict[str, int | float | list[Any] | None]
MARGIN = 0.10  # the share of the memory kept free: fragmentation, a longer batch, another process
LARGEST = 4096  # the doubling stops here even when memory is left


@dataclass(frozen=True)
class BatchChoice:
    """A batch size, its accumulation, where it comes from, and the figures that decided it."""

    batch_size: int
    grad_accum_steps: int
    source: str  # "configured", "probed" (CUDA) or "estimated" (from the memory estimate)
    figures: ProbeFigures = field(default_factory=dict)  # how `auto` decided; empty when configured

    def applied_to(self, runtime: Runtime) -> Runtime:
        """`runtime` training with this batch and accumulation."""
        return replace(
            runtime,
            batch_size=self.batch_size,
            grad_accum_steps=self.grad_accum_steps,
            batch_size_source=self.source,
        )


def accumulation(effective: int | None, batch_size: int, world_size: int, configured: int) -> int:
    """The accumulation steps that make `effective` samples per optimizer step, or `configured` when no
    effective batch is asked for."""
    if effective is None:
        return configured
    per_step = batch_size * world_size
    if effective % per_step:
        raise ConfigError(
            f"runtime.effective_batch_size {effective}: not a multiple of batch size {batch_size} x "
            f"{world_size} ranks; use a multiple of {per_step} or another batch size"
        )
    return effective // per_step


def largest_fitting(fits: Callable[[int], bool], limit: int = LARGEST) -> tuple[int, list[list[Any]]]:
    """The largest batch size in [1, limit] that `fits` (0 when not even 1 does), by doubling from 1 and
    bisecting between the last size that fit and the first that did not; and every size tried."""
    tried: list[list[Any]] = []

    def attempt(size: int) -> bool:
        ok = fits(size)
        tried.append([size, ok])
        return ok

    good, size = 0, 1
    while size <= limit and attempt(size):
        good, size = size, size * 2
    bad = min(size, limit + 1)
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if attempt(middle) else (good, middle)
    return good, tried


def divisor_at_most(limit: int, effective: int | None, world_size: int) -> int:
    """The largest batch size up to `limit` that divides the per-rank effective batch (any size when
    there is none)."""
    if effective is None:
        return limit
    per_rank = effective // world_size
    return max(size for size in range(1, min(limit, per_rank) + 1) if per_rank % size == 0)


def memory_budget(device: str, held: int) -> int:
    """Bytes a training step may use: what is free on the device (the host's available memory on CPU
    and MPS, which shares it) plus `held`, what this run has already allocated (its weights)."""
    if device == "cuda":
        return int(torch.cuda.mem_get_info()[0]) + held
    return int(psutil.virtual_memory().available) + held


def estimated_choice(
    memory: StepMemory,
    budget: int,
    effective: int | None = None,
    world_size: int = 1,
    configured_accum: int = 1,
) -> BatchChoice:
    """The largest batch whose estimate fits `budget` less the margin."""
    usable = int(budget * (1 - MARGIN))

    def estimate(size: int) -> int:
        accum = configured_accum if effective is None else max(1, effective // (size * world_size))
        return memory.total(size, accum)

    fitting, tried = largest_fitting(lambda size: estimate(size) <= usable)
    figures: ProbeFigures = {"budget_bytes": budget, "margin": MARGIN, "largest_fitting": fitting}
    figures["tried"] = tried
    if fitting == 0:
        lighter = "a smaller model" if memory.activation_checkpointing else "--activation-checkpointing"
        raise TrainingError(
            f"batch size auto: not even batch size 1 fits on {memory.device} (estimated "
            f"{estimate(1) / 2**30:.2f} GiB, {usable / 2**30:.2f} GiB usable of {budget / 2**30:.2f} GiB): "
            + f"use {lighter}"
        )
    size = divisor_at_most(fitting, effective, world_size)
    accum = accumulation(effective, size, world_size, configured_accum)
    return BatchChoice(size, accum, "estimated", figures | {"estimated_peak_memory_bytes": estimate(size)})


def probed_choice(
    step: Callable[[int], None],
    effective: int | None = None,
    world_size: int = 1,
    configured_accum: int = 1,
    limit: int = LARGEST,
) -> BatchChoice:
    """The largest batch for which `step(size)` (a real forward and backward) runs without running out of
    memory, less the margin."""

    def fits(size: int) -> bool:
        try:
            step(size)
            return True
        except (torch.OutOfMemoryError, RuntimeError) as error:
            if not is_out_of_memory(error):
                raise
            return False

    largest, tried = largest_fitting(fits, limit)
    if largest == 0:
        raise TrainingError("batch size auto: a step at batch size 1 runs out of memory on this device")
    size = divisor_at_most(max(1, math.floor(largest * (1 - MARGIN))), effective, world_size)
    accum = accumulation(effective, size, world_size, configured_accum)
    figures: ProbeFigures = {"largest_that_ran": largest, "margin": MARGIN, "tried": tried}
    return BatchChoice(size, accum, "probed", figures)


def probe_step(
    model: torch.nn.Module, config: ModelConfig, device: str, autocast: Any, reserve: int
) -> Callable[[int], None]:
    """One training step's memory at a batch size, leaving no trace: random tokens through forward and
    backward while `reserve` bytes stand for what the step does not allocate itself (AdamW's moments,
    accumulated gradients); gradients cleared, RNG state restored, the cache emptied."""

    def step(size: int) -> None:
        held = None
        try:
            with torch.random.fork_rng(devices=[device] if device == "cuda" else []):
                held = torch.empty(reserve, dtype=torch.uint8, device=device)
                tokens = torch.randint(0, config.vocab_size, (size, config.block_size), device=device)
                with autocast():
                    loss = model(tokens, tokens)[1]
                loss.backward()
                if device == "cuda":
                    torch.cuda.synchronize()
        finally:
            del held
            model.zero_grad(set_to_none=True)
            if device == "cuda":
                torch.cuda.empty_cache()

    return step


@dataclass(frozen=True)
class OutOfMemory:
    """What a run had when a step ran out of memory, and the budget measured when training started."""

    device: str
    batch_size: int
    grad_accum_steps: int
    world_size: int
    sequence_length: int
    estimate: Callable[[int, int], int]  # (batch size, accumulation) -> estimated peak bytes
    budget: int | None  # bytes a step could use (gptcore.runtime.memory.TrainingMemory.budget)

    def smaller_batch(self) -> tuple[int, int, str]:
        """(batch size, accumulation, why): the largest smaller batch whose estimate fits the budget less
        the margin, with the accumulation that keeps the effective batch."""
        per_rank = self.batch_size * self.grad_accum_steps
        usable = int((self.budget or 0) * (1 - MARGIN))

        def fits(size: int) -> bool:
            return self.estimate(size, per_rank // size) <= usable

        current = self.batch_size
        if self.budget is None or fits(current):  # no budget, or the estimate was too low: halve
            size, why = max(1, current // 2), "half the batch"
        else:
            fitting, _ = largest_fitting(fits, max(1, current - 1))
            size, why = max(1, fitting), "the largest smaller batch whose estimate fits"
        size = divisor_at_most(size, per_rank * self.world_size, self.world_size)
        return size, per_rank // size, why

    def response(self, error: BaseException, latest: Path | None) -> str:
        """The course's response, in one message: what ran out at which batch and sequence length, the
        batch to try, that the change is recorded, and where the rerun goes."""
        what = "GPU memory" if self.device == "cuda" else "host memory"
        detail = first_line(error)
        size, accum, why = self.smaller_batch()
        effective = self.batch_size * self.grad_accum_steps * self.world_size
        budget = f" of {self.budget * (1 - MARGIN) / 2**30:.2f} GiB usable" if self.budget else ""
        kept = f"the latest checkpoint {latest} is intact" if latest else "no checkpoint had been written yet"
        return (
            f"out of memory on {self.device} at batch size {self.batch_size}, sequence length "
            f"{self.sequence_length} ({what} ran out: {detail}; estimated peak "
            f"{self.estimate(self.batch_size, self.grad_accum_steps) / 2**30:.2f} GiB{budget}): "
            f"try --batch-size {size} --grad-accum {accum} ({why}, estimated peak "
            f"{self.estimate(size, accum) / 2**30:.2f} GiB; the same effective batch of {effective}); "
            "record the change with the run (the parameter file or --set, so its record says what it "
            "trained with); rerun in a fresh --checkpoint-directory unless deliberately resuming an "
            f"identical schedule (--resume); {kept}"
        )
