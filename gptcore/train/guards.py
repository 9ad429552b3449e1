"""The guards: a run whose loss or gradients stop being numbers, or whose model has come to predict
worse than a uniform guess, ends at once, clearly, with its last good checkpoint kept.

With fp16 the gradient scaler already skips a step whose gradients overflowed and lowers its scale;
that is how fp16 training works, so a skip is counted, not fatal, until `max_skipped_steps` in a row
show the scale cannot recover. Without a scaler (fp32, bf16) one non-finite step stops the run.

To keep CUDA's queue full, a step's verdict is read on the host one step late (after the next step's
work is queued) and at once before any evaluation, checkpoint or the end, so no checkpoint ever holds
weights touched by a non-finite update. On CPU reading it costs nothing and happens immediately.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gptcore.errors import TrainingError
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import INIT_STD

DEFAULT_MAX_SKIPPED_STEPS = 25


@dataclass
class _Pending:
    step: int
    loss: torch.Tensor
    grad_norm: torch.Tensor
    bad_ranks: torch.Tensor  # how many ranks saw a non-finite value (summed across ranks)


class NonFiniteGuard:
    """Every check that a step's numbers are numbers, in one place: `before_update()` before the
    optimizer's update, `observe()` after each step, `check_train_loss()` on each logged mean, and
    `settle()` before anything that must see finite weights."""

    def __init__(
        self,
        precision: str,
        scale: Callable[[], float] | None = None,
        max_skipped_steps: int = DEFAULT_MAX_SKIPPED_STEPS,
        immediate: bool = True,
        agree: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.precision = precision
        self.scale = scale  # the fp16 gradient scaler's current scale; None without a scaler
        self.max_skipped_steps = max_skipped_steps
        self.immediate = immediate
        # Sums a flag over data-parallel ranks, so every rank stops at the same step (none waits alone).
        self.agree = agree or (lambda tensor: tensor)
        self.last_checkpoint: str | None = None  # the trainer sets it after each save, for the message
        self.consecutive_skips = 0
        self.skipped_steps = 0
        self._scale_before = 0.0
        self._pending: _Pending | None = None

    @property
    def uses_grad_scaler(self) -> bool:
        return self.scale is not None

    def before_update(self) -> None:
        """Note the scale before the scaler decides on this step (it lowers it when it skips one)."""
        if self.scale is not None:
            self._scale_before = self.scale()

    def observe(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> bool:
        """Step `step` is done: whether it counts in the logged mean loss. With a scaler, the scaler's
        verdict (a skipped step does not count). Without, its summed loss and gradient norm (device
        tensors) are checked: the previous step's now, or this one at once when `immediate`."""
        if self.scale is not None:
            return self._scaler_took(step, self._scale_before, self.scale())
        norm = grad_norm.detach() if grad_norm is not None else torch.zeros((), device=loss.device)
        loss = loss.detach()
        bad = self.agree((~torch.isfinite(loss) | ~torch.isfinite(norm)).to(torch.float32))
        previous, self._pending = self._pending, _Pending(step, loss, norm, bad)
        if previous is not None:
            self._check(previous)
        if self.immediate:
            self.settle()
        return True

    def check_train_loss(self, step: int, mean_loss: float) -> None:
        """The mean training loss of a logged interval (every rank's, the same on each) is a number."""
        if not math.isfinite(mean_loss):
            raise TrainingError(
                f"training loss is {mean_loss} at step {step}; stopped{self._kept()}: lower the learning "
                "rate or use --precision bf16/fp32"
            )

    def settle(self) -> None:
        """Check the step still waiting for its verdict (before evaluation, checkpoints, the end)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._check(pending)

    def _scaler_took(self, step: int, scale_before: float, scale_after: float) -> bool:
        """Whether the scaler applied this step. Counts consecutive skips and stops the run when they
        reach the limit: skipping an overflow is how fp16 training works, a scale that cannot recover
        is not."""
        if scale_after >= scale_before:
            self.consecutive_skips = 0
            return True
        self.consecutive_skips += 1
        self.skipped_steps += 1
        if self.consecutive_skips >= self.max_skipped_steps:
            raise TrainingError(
                f"{self.precision}: {self.consecutive_skips} consecutive steps up to step {step} had "
                f"non-finite gradients and were skipped (gradient scale now {scale_after:g}); stopped"
                f"{self._kept()}: lower the learning rate or use --precision bf16 or fp32"
            )
        return False

    def _check(self, pending: _Pending) -> None:
        if not pending.bad_ranks.item():
            return
        loss, norm = float(pending.loss.item()), float(pending.grad_norm.item())
        what = "loss" if not math.isfinite(loss) else "gradient norm"
        if math.isfinite(loss) and math.isfinite(norm):
            what = "loss or gradient norm on another rank"
        raise TrainingError(
            f"non-finite {what} at step {pending.step} in {self.precision} (loss {loss}, gradient norm "
            f"{norm}); stopped{self._kept()}: lower the learning rate or check the data"
        )

    def _kept(self) -> str:
        return kept_checkpoint(self.last_checkpoint)


def kept_checkpoint(last_checkpoint: str | None) -> str:
    """What a stopped run leaves to resume from, as the end of its message."""
    if last_checkpoint is None:
        return " (no checkpoint had been written yet)"
    return f"; the last good checkpoint {last_checkpoint} is kept"


def uniform_loss(vocab_size: int) -> float:
    """The loss of a model that knows nothing: the same probability for every token, ln(V) nats."""
    return math.log(vocab_size)


def untrained_loss(config: ModelConfig) -> float:
    """About the loss of the freshly initialised model: a little above ln(V), by half the variance of
    its logits (unit-variance LayerNorm features against a tied embedding of std INIT_STD)."""
    return uniform_loss(config.vocab_size) + config.n_embd * INIT_STD**2 / 2


class DivergenceGuard:
    """After warmup, a validation loss above the uniform guess ln(V), and above where the untrained
    model starts (a little higher, `untrained_loss`), means the run diverged: the model now predicts
    worse than knowing nothing, and more steps only spend time. Checked at each evaluation, before that
    evaluation's checkpoints, so the last good checkpoint stays the latest."""

    TOLERANCE = 0.05  # nats above the untrained model's loss

    def __init__(
        self,
        config: ModelConfig,
        warmup_steps: int,
        learning_rate: float,
        precision: str,
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled
        self.vocab_size = config.vocab_size
        self.uniform = uniform_loss(config.vocab_size)
        self.ceiling = untrained_loss(config) + self.TOLERANCE
        self.warmup_steps = warmup_steps
        self.learning_rate = learning_rate
        self.precision = precision

    def check(self, step: int, val_loss: float, last_checkpoint: str | None) -> None:
        if not self.enabled or step <= self.warmup_steps:
            return
        if math.isfinite(val_loss) and val_loss <= self.ceiling:
            return
        raise TrainingError(
            f"validation loss {val_loss:.4f} at step {step} is above the uniform guess "
            f"ln({self.vocab_size}) = {self.uniform:.4f} (the untrained model starts near "
            f"{self.ceiling - self.TOLERANCE:.4f}): training diverged; stopped"
            f"{kept_checkpoint(last_checkpoint)}: lower the learning rate (peak {self.learning_rate:g}) "
            f"or train in a wider precision than {self.precision}"
        )
