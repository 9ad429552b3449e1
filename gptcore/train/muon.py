"""Muon for the hidden matrices, AdamW for the rest: the optimizer of the modern recipe
(`OptimizerConfig.name: muon`).

Muon (Jordan et al., 2024; `torch.optim.Muon`) replaces each 2-D weight's momentum by its nearest
semi-orthogonal matrix (five Newton-Schulz iterations) before the step, so every direction of the update
moves at the same rate. It suits the blocks' linear weights only: the token embedding and the output
head are lookups and a classifier over the vocabulary, and norms and biases are not matrices, so those
train with AdamW as before (Keller Jordan's modded-nanogpt split). Both see the same schedule: each
group's learning rate is the schedule's rate times its `lr_scale` (Muon's rate over AdamW's).

Every rank of a data-parallel run steps the same all-reduced gradients through the same deterministic
iterations, so Muon's update is the same on every rank, as AdamW's is.

`torch.optim.Muon` orthogonalises in bfloat16, cheap where the hardware multiplies bf16 (a GPU, a CPU
with AVX512-BF16 or AMX) and several times dearer than fp32 where a CPU converts every operand (an
AVX2-only one): `Muon` here is torch's with the iterations' dtype chosen per device
(`orthogonal_dtype`), the same update to bf16's rounding, the same state and checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from gptcore.runtime.precision_speed import cpu_native

LR_SCALE = "lr_scale"  # a param group's rate relative to the schedule's (gptcore.train.schedule)


def orthogonal_dtype(device: str) -> torch.dtype:
    """bf16 (torch's choice) where it is multiplied natively: CUDA, or a CPU whose flags say so; fp32
    elsewhere. Read from the CPU's flags, not timed, so a resume on the same machine chooses the same."""
    if device == "cuda" or (device == "cpu" and cpu_native("bf16")):
        return torch.bfloat16
    return torch.float32


def adjusted_rate(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """The rate of one matrix of `shape` (out x in), as torch's Muon scales it (`adjust_lr_fn`): "original"
    (Jordan's, the default) by sqrt(max(1, out/in)), "match_rms_adamw" (Moonshot's) to AdamW's update size,
    0.2·sqrt(max(out, in)). torch keeps this in a private helper (torch.optim._muon._adjust_lr); written
    here so an upgrade that moves it breaks no import, and tests/test_contracts.py holds the two equal."""
    rows, columns = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1.0, rows / columns))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, columns))
    return lr


def orthogonalise(update: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> Tensor:  # fmt: skip
    """The Newton-Schulz iterations of torch's Muon (a quintic pushing every singular value towards 1)
    in `dtype`: about U V^T of the update's SVD, semi-orthogonal whichever side is longer."""
    a, b, c = coefficients
    tall = update.size(0) > update.size(1)
    x = update.to(dtype)
    x = x.T if tall else x  # the Gram matrix of the short side: the cheaper product
    x = x.div(x.norm().clamp(min=eps))  # spectral norm at most 1: inside the iteration's basin
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


class Muon(torch.optim.Muon):
    """`torch.optim.Muon` (its groups, defaults, state and checkpoints) orthogonalising in
    `orthogonal_dtype`: with bf16 it is torch's step to the bit (tests/test_muon.py)."""

    def __init__(self, groups: Any, *, dtype: torch.dtype = torch.bfloat16, **options: Any) -> None:
        super().__init__(groups, **options)  # the parameters, or their groups
        self.dtype = dtype

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for parameter in group["params"]:
                if parameter.grad is None:
                    continue
                grad, state = parameter.grad, self.state[parameter]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
                buffer = state["momentum_buffer"]
                buffer.lerp_(grad, 1 - momentum)
                update = grad.lerp(buffer, momentum) if group["nesterov"] else buffer
                update = orthogonalise(
                    update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.dtype
                )
                parameter.mul_(1 - lr * group["weight_decay"])
                parameter.add_(update, alpha=-adjusted_rate(lr, group["adjust_lr_fn"], parameter.shape))


def hidden_matrices(model: nn.Module) -> set[int]:
    """The ids of the trainable 2-D weights inside the blocks (`transformer.h.*`): what Muon trains."""
    return {
        id(parameter)
        for name, parameter in model.named_parameters()
        if parameter.requires_grad and parameter.dim() == 2 and name.startswith("transformer.h.")
    }


class MuonWithAdamW:
    """Two optimizers stepped as one, with the parts of `torch.optim.Optimizer` the trainer, the
    schedule, the gradient scaler and the checkpoints use: `param_groups` (both optimizers' own group
    dicts, so a rate set there is the one each steps with), `state`, `step`, `zero_grad`, `state_dict`
    and `load_state_dict`."""

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer) -> None:
        self.muon, self.adamw = muon, adamw

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Both optimizers' groups, read anew: loading a state replaces each optimizer's group dicts."""
        return [*self.muon.param_groups, *self.adamw.param_groups]

    @property
    def state(self) -> dict[Any, Any]:
        return {**self.muon.state, **self.adamw.state}

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:
        self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])
