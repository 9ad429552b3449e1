"""The smoke gate: full training starts only after a bounded run proved the configuration trains and fits.

The smoke run is the full run's first steps (its optimizer and schedule). Its record must show: every
loss finite; the train loss falling (last logged below first); the validation loss, evaluated at the
start and the end at least, not rising (the last at most `VAL_TOLERANCE` above the first) and, once
training has begun, never above the uniform guess ln(V) (nor above the untrained start, which sits a
little above it); and the measured peak memory within the
device's. The train loss alone is not enough: it is measured before each update, so it can still read
"falling" while the last updates throw the model off (a learning rate too high for it). The record
also carries the measured throughput and the full run's estimated time.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from gptcore.errors import TrainingError
from gptcore.runtime.device import DeviceReport
from gptcore.tools.records import JSONObject
from gptcore.train.guards import uniform_loss

# How far the last validation loss may sit above the first, in nats: same examples, so no sampling
# noise, only the wobble of a few early updates.
VAL_TOLERANCE = 0.05


@dataclass(frozen=True)
class GateResult:
    finite: bool
    falling: bool
    val_not_rising: bool
    below_uniform: bool
    fits: bool
    first_train_loss: float
    last_train_loss: float
    first_val_loss: float
    last_val_loss: float
    worst_val_loss: float  # the highest after the first evaluation
    uniform_loss: float
    val_tolerance: float
    peak_memory_bytes: int
    memory_limit_bytes: int

    @property
    def passed(self) -> bool:
        return self.finite and self.falling and self.val_not_rising and self.below_uniform and self.fits

    def reasons(self) -> list[str]:
        reasons = []
        if not self.finite:
            reasons.append("a loss is not finite")
        if not self.falling:
            reasons.append(
                f"train loss did not fall ({self.first_train_loss:.4f} -> {self.last_train_loss:.4f})"
            )
        if not self.val_not_rising:
            reasons.append(
                f"validation loss rose {self.first_val_loss:.4f} -> {self.last_val_loss:.4f} (more than "
                f"{self.val_tolerance} nats) while the train loss read "
                f"{self.first_train_loss:.4f} -> {self.last_train_loss:.4f}"
            )
        if not self.below_uniform:
            reasons.append(
                f"validation loss reached {self.worst_val_loss:.4f}, above the uniform guess "
                f"{self.uniform_loss:.4f} = ln(vocabulary)"
            )
        if not self.fits:
            reasons.append(
                f"peak memory {self.peak_memory_bytes} bytes exceeds the device's {self.memory_limit_bytes}"
            )
        return reasons

    def likely_cause(self, learning_rate: float, precision: str) -> str:
        """What to change first, from which checks failed."""
        if not self.fits:
            return "the batch does not fit: lower runtime.batch_size and raise runtime.grad_accum_steps"
        if not self.finite and precision == "fp16":
            return f"fp16 overflow or a learning rate too high (peak {learning_rate:g}): try bf16 or fp32"
        if not self.passed:
            return (
                f"the learning rate (peak {learning_rate:g}) is likely too high for this model, or the "
                f"precision {precision} too coarse: lower the optimizer's learning_rate or train in fp32"
            )
        return "none"

    def to_dict(self) -> JSONObject:
        return {**asdict(self), "passed": self.passed}


def judge(
    train_losses: list[float],
    val_losses: list[float],
    peak_memory: int,
    memory_limit: int,
    vocab_size: int,
    val_tolerance: float = VAL_TOLERANCE,
) -> GateResult:
    """Apply the checks to the losses a smoke run logged (validation from its first evaluation, at the
    start, to its last) and its measured peak memory."""
    if len(train_losses) < 2:
        raise TrainingError(
            f"smoke training logged {len(train_losses)} train losses; the gate needs at least 2 "
            "(lower smoke.log_every or raise smoke.max_steps)"
        )
    if len(val_losses) < 2:
        raise TrainingError(
            f"smoke training recorded {len(val_losses)} validation losses; the gate needs one at the start "
            "and one at the end (keep smoke.eval_at_start: true and give the run validation tokens)"
        )
    finite = all(math.isfinite(loss) for loss in [*train_losses, *val_losses])
    uniform = uniform_loss(vocab_size)
    # The first evaluation is the untrained model, itself a little above ln(V) (random logits): a model
    # that has not yet moved from there is slow, not diverged, and the rise check covers it.
    ceiling = max(uniform, val_losses[0] + val_tolerance)
    worst = max(val_losses[1:]) if finite else math.nan
    return GateResult(
        finite=finite,
        falling=finite and train_losses[-1] < train_losses[0],
        val_not_rising=finite and val_losses[-1] <= val_losses[0] + val_tolerance,
        below_uniform=finite and worst <= ceiling,
        fits=peak_memory <= memory_limit,
        first_train_loss=train_losses[0],
        last_train_loss=train_losses[-1],
        first_val_loss=val_losses[0],
        last_val_loss=val_losses[-1],
        worst_val_loss=worst,
        uniform_loss=uniform,
        val_tolerance=val_tolerance,
        peak_memory_bytes=peak_memory,
        memory_limit_bytes=memory_limit,
    )


def memory_limit(report: DeviceReport) -> int:
    """The memory a run may use: the GPU's on CUDA, the machine's physical memory on CPU."""
    if report.device == "cuda" and report.gpu_memory_bytes:
        return report.gpu_memory_bytes
    import psutil

    return int(psutil.virtual_memory().total)


@dataclass(frozen=True)
class DataSizing:
    """The corpus against the model: tokens per parameter of the full run and of one pass over the train
    split. A compute-optimal run wants about 20 tokens a parameter; under 1 a pass the model learns the
    split by heart sooner than the language."""

    parameter_count: int
    train_tokens: int  # the train split: one epoch
    full_tokens: int  # what the full run trains on: its steps x global batch x sequence length

    @property
    def tokens_per_parameter(self) -> float:
        return self.full_tokens / self.parameter_count

    @property
    def train_tokens_per_parameter(self) -> float:
        return self.train_tokens / self.parameter_count

    def figures(self) -> dict[str, float]:
        return {
            "tokens_per_parameter": round(self.tokens_per_parameter, 3),
            "train_tokens_per_parameter": round(self.train_tokens_per_parameter, 3),
        }

    def warning(self) -> str | None:
        if self.train_tokens_per_parameter >= 1:
            return None
        return (
            f"the train split holds {self.train_tokens_per_parameter:.2f} tokens per parameter "
            f"({self.train_tokens:,} tokens for {self.parameter_count:,} parameters), under 1: the model "
            "will learn it by heart; give it a larger corpus (corpus.paths or corpus.hub_name, with "
            "data.max_tokens) or a smaller model (model)"
        )
