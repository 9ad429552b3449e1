"""Figures: FLOPs per token and MFU, steady-state throughput, and the memory estimate a run is judged by.

MFU = achieved model FLOP/s / peak FLOP/s, model FLOPs per token as `gptcore.model.size` counts them.
The peak is the GPU's datasheet dense figure for the precision where the GPU is known, else the best
FLOP/s of matmuls measured in this process at its thread count: a 2048^3 square by default, the
square plus the model's own GEMM shapes (`model_matmul_shapes`) in the CPU benchmark.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cache

import torch

from gptcore.model.config import ModelConfig
from gptcore.model.size import flops_per_token
from gptcore.runtime.decided import Runtime
from gptcore.runtime.memory import StepMemory
from gptcore.runtime.precision_speed import DTYPES, synchronize

# Dense (no sparsity) tensor-core peaks in FLOP/s, from the vendors' datasheets (SXM parts).
GPU_PEAKS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12},
}


def mfu(tokens_per_second: float, flops_token: int, peak_flops: float) -> float:
    return tokens_per_second * flops_token / peak_flops if peak_flops > 0 else 0.0


Shape = tuple[int, int, int]  # (m, k, n) of an (m, k) @ (k, n) matmul

SQUARE: tuple[Shape, ...] = ((2048, 2048, 2048),)
# The probe's rows stop here: past a few thousand rows a GEMM's FLOP/s no longer grows, and a probe at
# a large batch's full token count would allocate what the step itself may not have (batch 2048 x 1024
# tokens against a 16k vocabulary: a 64 GiB product).
PROBE_ROWS = 4096
# And a product's work stops near here (17 GFLOP: about 0.2 s in fp32 on this project's CPUs; iteration
# 1's shapes stay whole), so the probe stays seconds, not minutes, where a precision is emulated at a few
# GFLOP/s (gpt_100m's head at 4096 rows was 103 GFLOP a product).
PROBE_FLOPS = 2**34


def model_matmul_shapes(config: ModelConfig, tokens: int) -> tuple[Shape, ...]:
    """The forward GEMMs of a training step of `tokens` tokens, at most `PROBE_ROWS` of them (backward
    ones are their transposes):
    output head, MLP up and down, QKV. With the square matmul they make the peak's candidate set, so
    the roof is what this library reaches on the shapes the model actually runs, not on one shape
    that may be unusually fast or slow here."""
    d, tokens = config.n_embd, min(tokens, PROBE_ROWS)

    def rows(k: int, n: int) -> int:
        return min(tokens, max(64, PROBE_FLOPS // (2 * k * n)))

    hidden = config.mlp_width()
    up = 2 * hidden if config.mlp == "swiglu" else hidden  # SwiGLU's gate and up: one fused product
    shapes = ((d, config.vocab_size), (d, up), (hidden, d), (d, 3 * d))
    return tuple((rows(k, n), k, n) for k, n in shapes)


def _dtype(device: str, precision: str) -> torch.dtype:
    if device == "cpu" and precision == "fp16":
        return torch.bfloat16  # fp16 autocast on CPU runs its matmuls no faster than bf16's roof
    return DTYPES[precision]


def matmul_flops(device: str, precision: str, shape: Shape, seconds: float = 0.2, repeats: int = 3) -> float:
    """The best FLOP/s of (m, k) @ (k, n) matmuls timed for about `seconds` after one untimed warm-up:
    at least `repeats` times where that fits in `seconds`, else once. The best, since a shared machine
    only ever slows a matmul down."""
    m, k, n = shape
    dtype = _dtype(device, precision)
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    deadline = time.perf_counter() + seconds
    attempt = 0
    while time.perf_counter() < deadline or attempt < (repeats if best * repeats < seconds else 1):
        synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
        attempt += 1
    return 2 * m * k * n / best


@cache
def measured_matmul_peak(
    device: str, precision: str, shapes: tuple[Shape, ...] = SQUARE, seconds: float = 0.4
) -> float:
    """The best FLOP/s over `shapes` (each timed for about `seconds`) in this precision on this
    device, now, with this process's thread count: the roof the model's matmuls can reach here."""
    return max(matmul_flops(device, precision, shape, seconds) for shape in shapes)


def peak_flops(
    device: str, precision: str, tf32: bool, shapes: tuple[Shape, ...] = SQUARE, seconds: float = 0.4
) -> tuple[float, str]:
    """(peak FLOP/s, where it comes from): the datasheet on known GPUs, else the best measured over
    `shapes` (the trainer passes the model's own, `model_matmul_shapes`: the roof its matmuls reach)."""
    known = datasheet_peak(device, precision, tf32)
    if known is not None:
        return known
    peak = measured_matmul_peak(device, precision, shapes, seconds)
    return peak, f"measured {precision} matmul on {device}, best of {len(shapes)} shapes"


def datasheet_peak(device: str, precision: str, tf32: bool) -> tuple[float, str] | None:
    """(peak FLOP/s, source) from the datasheet of a known GPU, else None."""
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name()
    key = precision if precision != "fp32" else ("tf32" if tf32 else "")
    for family, peaks in GPU_PEAKS.items():
        if family in name and key in peaks:
            return peaks[key], f"{family} datasheet dense {key}"
    return None


@dataclass
class Throughput:
    """Tokens and steps per second. `steady_*` covers steady-state steps only: the first `warmup` steps
    after a (re)start of the loop (allocator growth, kernel selection, compilation) are excluded.
    `interval_*` covers the steps since the last log line. Time outside steps (evaluation,
    checkpoints) is excluded by calling `start()` again before the next step."""

    tokens_per_step: int
    warmup: int = 2
    steps_seen: int = 0
    steady_steps: int = 0
    steady_seconds: float = 0.0
    interval_steps: int = 0
    interval_seconds: float = 0.0
    timed_steps: int = 0
    timed_seconds: float = 0.0
    _last: float | None = None

    def start(self) -> None:
        self._last = time.perf_counter()

    def step_done(self) -> None:
        """Record one optimizer step. On CUDA the step may only be queued; the caller synchronises at
        log intervals, so the time of a whole interval is still right."""
        now = time.perf_counter()
        if self._last is not None:
            elapsed = now - self._last
            self.interval_steps += 1
            self.interval_seconds += elapsed
            self.timed_steps += 1
            self.timed_seconds += elapsed
            if self.steps_seen >= self.warmup:
                self.steady_steps += 1
                self.steady_seconds += elapsed
        self.steps_seen += 1
        self._last = now

    def take_interval(self) -> tuple[float, float]:
        """(steps/s, tokens/s) since the last call."""
        rate = self.interval_steps / self.interval_seconds if self.interval_seconds > 0 else 0.0
        self.interval_steps, self.interval_seconds = 0, 0.0
        return rate, rate * self.tokens_per_step

    @property
    def steps_per_second(self) -> float:
        if self.steady_seconds > 0:
            return self.steady_steps / self.steady_seconds
        # A run too short for a steady state: every timed step, warm-up included (an underestimate).
        return self.timed_steps / self.timed_seconds if self.timed_seconds > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.steps_per_second * self.tokens_per_step


@dataclass(frozen=True)
class RunMeasures:
    """What a run's speed and memory are judged by: model FLOPs per token, the peak FLOP/s they are
    measured against (every rank's, since tokens/s are the whole job's), and the memory estimate."""

    flops_per_token: int
    peak_flops: float
    peak_flops_source: str
    estimated_memory: dict[str, int]

    @classmethod
    def of(
        cls,
        model: torch.nn.Module,
        runtime: Runtime,
        memory: StepMemory,
        world_size: int = 1,
        measure_peak: bool = True,
    ) -> RunMeasures:
        """Measured for `model` (a GPT) at the runtime's batch; the CPU peak takes about 0.1 s per shape
        to measure. Without `measure_peak` (a dry run, which trains nothing to judge) nothing is
        multiplied: the peak is the datasheet's where the GPU is known, else 0 and says so."""
        config = model.config
        shapes = model_matmul_shapes(config, runtime.batch_size * config.block_size)
        if measure_peak:
            peak, source = peak_flops(
                runtime.device, runtime.precision, runtime.tf32_enabled, shapes, seconds=0.1
            )
        else:
            peak, source = datasheet_peak(runtime.device, runtime.precision, runtime.tf32_enabled) or (
                0.0,
                "not measured: a dry run multiplies nothing",
            )
        if world_size > 1:
            peak, source = peak * world_size, f"{source} x {world_size} ranks"
        return cls(
            flops_per_token(config, model.matmul_parameter_count(), model.frozen_matmul_parameter_count()),
            peak,
            source,
            memory.estimate(runtime.batch_size, runtime.grad_accum_steps),
        )

    @property
    def estimated_peak_memory_bytes(self) -> int:
        return self.estimated_memory["total"]

    def mfu(self, tokens_per_second: float) -> float:
        return mfu(tokens_per_second, self.flops_per_token, self.peak_flops)
