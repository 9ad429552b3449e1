"""Low-rank adapters (`gptcore.finetune.lora`): which layers, what rank, what scale."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gptcore.tools.strict import Strict

# The linear layers LoRA may adapt, in the model's own terms (gptcore.model.gpt: each block's `attn` and
# `mlp`); the tied embedding and output head are never adapted.
LoRATarget = Literal["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]


class LoRAConfig(Strict):
    """Low-rank adapters on a model's linear layers (gptcore.finetune.lora): each adapted weight W
    trains as W + B·A·alpha/r, W frozen, A (r x in) random, B (out x r) zero at the start."""

    r: int = Field(default=8, ge=1, description="the rank: at most the smaller side of each adapted layer")
    alpha: float = Field(default=16.0, gt=0.0, description="the update's scale is alpha / r")
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="on the adapter's input, in training")
    targets: list[LoRATarget] = Field(
        default=["attn.c_attn", "attn.c_proj"], min_length=1, description="the layers adapted in every block"
    )
