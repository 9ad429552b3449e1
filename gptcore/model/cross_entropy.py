"""Mean cross-entropy over a large vocabulary with the gradient computed in one pass over the logits.

`F.cross_entropy` on CPU takes the log-softmax forward, a zero-filled gradient for NLL's backward and a
log-softmax backward: four passes over a `tokens x vocabulary` array (64 MiB per step for
`gpt_first_cpu`), about a quarter of an fp32 step on 2 cores. The gradient of the mean cross-entropy
with respect to the logits is `(softmax - one_hot) / tokens`, and the softmax is the exponential of the
log-probabilities the forward already keeps, so the backward here turns that saved array into the
gradient in place: one exponential pass, one subtraction per row, one scaling pass.

The log-probabilities are computed in float32 whatever the logits' dtype (bf16 or fp16 under autocast),
the gradient comes back in the logits' dtype. A target of `IGNORE` (-1) is no target: a chat
conversation's prompt, which the model reads but is not trained to write. The mean is over the others.
"""

from __future__ import annotations

from typing import Any

import torch

IGNORE = -1  # a position with no target: counted neither in the loss nor in its mean


def trained_count(targets: torch.Tensor) -> torch.Tensor:
    """How many of `targets` are targets (not `IGNORE`), as a tensor on their device (no host sync)."""
    return (targets != IGNORE).sum()


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        kept = targets != IGNORE
        picked = targets.clamp(min=0)  # an ignored row gathers id 0, then weighs nothing
        count = kept.sum().clamp(min=1)  # no target at all: a loss of 0, not 0 / 0
        loss = -(log_probs.gather(1, picked.unsqueeze(1)).squeeze(1) * kept).sum() / count
        ctx.save_for_backward(log_probs, picked, kept, count)
        ctx.logits_dtype = logits.dtype
        ctx.consumed = False
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.consumed:
            raise RuntimeError(
                "cross_entropy: backward through this loss ran twice (retain_graph is unsupported)"
            )
        ctx.consumed = True  # the saved log-probabilities become the gradient below
        log_probs, picked, kept, count = ctx.saved_tensors
        grad = log_probs.exp_()
        grad[torch.arange(picked.numel(), device=picked.device), picked] -= 1.0
        grad.mul_((kept * (grad_loss / count)).unsqueeze(1))  # one pass: the mean's scale, 0 when ignored
        return grad.to(ctx.logits_dtype), None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of `logits` (tokens x vocabulary) against `targets` (tokens; `IGNORE` for a
    position without one), as a float32 scalar; equal to `F.cross_entropy(logits.float(), targets,
    ignore_index=IGNORE)` in value and gradient (0 where no position has a target)."""
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"cross_entropy takes (N, V) logits and (N,) targets, got {tuple(logits.shape)} "
            f"and {tuple(targets.shape)}"
        )
    return _CrossEntropy.apply(logits, targets)
