"""The smoke gate: full training starts only after a bounded run proved the configuration trains and fits.

Three checks on the smoke record: every loss finite, the train loss falling (last logged below first), and
the measured peak memory within the device's memory. The record also carries the measured throughput and
the full run's estimated time (its planned steps at the smoke's measured steps per second).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from gptcore.errors import TrainingError


@dataclass(frozen=True)
class GateResult:
    finite: bool
    falling: bool
    fits: bool
    first_train_loss: float
    last_train_loss: float
    peak_memory_bytes: int
    memory_limit_bytes: int

    @property
    def passed(self) -> bool:
        return self.finite and self.falling and self.fits

    def reasons(self) -> list[str]:
        reasons = []
        if not self.finite:
            reasons.append("a loss is not finite")
        if not self.falling:
            reasons.append(
                f"train loss did not fall ({self.first_train_loss:.4f} -> {self.last_train_loss:.4f})"
            )
        if not self.fits:
            reasons.append(
                f"peak memory {self.peak_memory_bytes} bytes exceeds the device's {self.memory_limit_bytes}"
            )
        return reasons

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


def judge(
    train_losses: list[float], val_losses: list[float], peak_memory: int, memory_limit: int
) -> GateResult:
    """Apply the three checks to the losses a smoke run logged and its measured peak memory."""
    if len(train_losses) < 2:
        raise TrainingError(
            f"smoke training logged {len(train_losses)} train losses; the gate needs at least 2 "
            "(lower smoke.log_every or raise smoke.max_steps)"
        )
    finite = all(math.isfinite(loss) for loss in [*train_losses, *val_losses])
    return GateResult(
        finite=finite,
        falling=finite and train_losses[-1] < train_losses[0],
        fits=peak_memory <= memory_limit,
        first_train_loss=train_losses[0],
        last_train_loss=train_losses[-1],
        peak_memory_bytes=peak_memory,
        memory_limit_bytes=memory_limit,
    )


def memory_limit(device_report: dict[str, Any]) -> int:
    """The memory a run may use: the GPU's on CUDA, the machine's physical memory on CPU."""
    if device_report.get("device") == "cuda" and device_report.get("gpu_memory_bytes"):
        return int(device_report["gpu_memory_bytes"])
    import psutil

    return int(psutil.virtual_memory().total)


def estimate_full_seconds(full_planned_steps: int, smoke_steps_per_second: float) -> float:
    """Planned optimizer steps of the full run at the smoke run's measured rate (same batch, device)."""
    if smoke_steps_per_second <= 0:
        return math.inf
    return full_planned_steps / smoke_steps_per_second
