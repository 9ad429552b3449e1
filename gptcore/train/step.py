"""One optimizer step: forward and backward over the global batch's micro-batches, then unscale, clip
and apply the update at the schedule's rate. The trainer asks for a step; this decides how it is taken.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from gptcore.runtime.decided import Runtime
from gptcore.train.guards import NonFiniteGuard
from gptcore.train.schedule import WarmupCosine


def accumulate_gradients(
    forward: Any,
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    accum: int,
    runtime: Runtime,
    scaler: torch.amp.GradScaler,
    no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> torch.Tensor:
    """Forward and backward over the next `accum` micro-batches, adding the gradient of their mean loss
    (each micro-batch's mean loss / accum) into `.grad`. Returns the sum of the micro-batch losses,
    detached and still on the device (no host sync). With `no_sync` (DDP's), gradients are averaged
    across ranks only in the last micro-step's backward: the others just accumulate locally."""
    total = None
    for micro in range(accum):
        x, y = next(batches)
        skip_sync = no_sync is not None and micro < accum - 1
        with no_sync() if skip_sync else contextlib.nullcontext():
            with runtime.autocast():
                loss = forward(x, y)[1]  # the logits go now, not after the backward pass
            scaler.scale(loss / accum).backward()
        total = loss.detach() if total is None else total + loss.detach()
    return total


class OptimizerStep:
    """`optimizer_step(batches, index, logging)`: the gradients of the next global batch, clipped and
    applied at step `index`'s rate (`logging`: the norm is wanted for the log line).
    Returns the summed micro-batch loss and the gradient norm (None when nobody needs it), both on the
    device: reading them is the guard's and the log's business, when they choose."""

    def __init__(
        self,
        model: torch.nn.Module,
        forward: Any,
        optimizer: torch.optim.Optimizer,
        schedule: WarmupCosine,
        scaler: torch.amp.GradScaler,
        runtime: Runtime,
        grad_clip: float,
        nonfinite: NonFiniteGuard,
        ddp: torch.nn.parallel.DistributedDataParallel | None = None,
    ) -> None:
        self.model, self.forward, self.optimizer = model, forward, optimizer
        self.schedule, self.scaler, self.runtime = schedule, scaler, runtime
        self.grad_clip, self.nonfinite = grad_clip, nonfinite
        self.no_sync = ddp.no_sync if ddp is not None else None

    def __call__(
        self, batches: Iterator[Any], index: int, logging: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.schedule.apply(self.optimizer, index)
        accum = self.runtime.grad_accum_steps
        loss = accumulate_gradients(self.forward, batches, accum, self.runtime, self.scaler, self.no_sync)
        self.scaler.unscale_(self.optimizer)
        # The norm costs a pass over the gradients: taken to clip, to log, or for the guard to check.
        needs_norm = self.grad_clip > 0 or logging or not self.nonfinite.uses_grad_scaler
        grad_norm = self._grad_norm() if needs_norm else None
        self.nonfinite.before_update()  # the fp16 scale before the scaler decides on this step
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss, grad_norm

    def _grad_norm(self) -> torch.Tensor:
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        clip = self.grad_clip if self.grad_clip > 0 else float("inf")
        return torch.nn.utils.clip_grad_norm_(parameters, clip, foreach=True)
