"""Where a run is: optimizer steps taken and the best validation loss so far. The epoch follows from the
step, so it is derived, never stored."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class TrainState:
    steps_per_epoch: int  # optimizer steps that use one epoch's examples (the remainder fills none)
    step: int = 0
    best_val_loss: float | None = None

    @property
    def epoch(self) -> int:
        """The epoch the next step draws from."""
        return self.step // self.steps_per_epoch

    def improves(self, val_loss: float) -> bool:
        """Whether `val_loss` beats the best so far (and records it when it does)."""
        if self.best_val_loss is not None and val_loss >= self.best_val_loss:
            return False
        self.best_val_loss = val_loss
        return True

    def state_dict(self) -> dict[str, int | float | None]:
        return {"step": self.step, "best_val_loss": self.best_val_loss}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """From a checkpoint's state, which holds `state_dict()`'s entries among its own."""
        self.step = int(state["step"])
        self.best_val_loss = state["best_val_loss"]
