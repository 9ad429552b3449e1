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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

LR_SCALE = "lr_scale"  # a param group's rate relative to the schedule's (gptcore.train.schedule)


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
