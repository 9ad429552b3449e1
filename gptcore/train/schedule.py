"""Learning rate: linear warmup, then cosine decay to the minimum over the planned optimizer steps."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from gptcore.train.muon import LR_SCALE


@dataclass(frozen=True)
class WarmupCosine:
    peak: float
    minimum: float
    warmup_steps: int
    total_steps: int

    def rate(self, step: int) -> float:
        """The learning rate for optimizer step `step` (0-based)."""
        if step < self.warmup_steps:
            return self.peak * (step + 1) / self.warmup_steps
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        return self.minimum + 0.5 * (1.0 + math.cos(math.pi * progress)) * (self.peak - self.minimum)

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        rate = self.rate(step)
        for group in optimizer.param_groups:
            group["lr"] = rate * group.get(LR_SCALE, 1.0)  # Muon's groups: their own peak, same shape
        return rate

    def state_dict(self) -> dict[str, float | int]:
        """The schedule is a pure function of the step; its settings are stored to detect a change."""
        return asdict(self)
