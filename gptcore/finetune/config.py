"""Low-rank adapters (`gptcore.finetune.lora`): which layers, what rank, what scale; QLoRA's base."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, field_validator

from gptcore.tools.records import JSONObject
from gptcore.tools.strict import Strict

# The linear layers LoRA may adapt, each block's, by the role they have in every recipe (gptcore.model.gpt
# keeps GPT-2's names in the modern recipe too, and an imported GPT-2 is read into them): `attn.c_attn`
# the queries, keys and values (one fused layer), `attn.c_proj` attention's output, `mlp.c_fc` the MLP's
# input (up; SwiGLU's gate and up fused), `mlp.c_proj` its output (down). The embedding and the output
# head are never adapted: they train whole, or not at all (`train_embedding`).
LoRATarget = Literal["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
# The same layers by role, as a parameter file may name them; read as the layers' names, so a run's
# identity and its adapter's files are the same whichever way the file said it.
ROLES: dict[str, LoRATarget] = {
    "qkv": "attn.c_attn",
    "attention_output": "attn.c_proj",
    "mlp_up": "mlp.c_fc",
    "mlp_down": "mlp.c_proj",
}


class LoRAConfig(Strict):
    """Low-rank adapters on a model's linear layers (gptcore.finetune.lora): each adapted weight W
    trains as W + B·A·alpha/r, W frozen, A (r x in) random, B (out x r) zero at the start."""

    r: int = Field(default=8, ge=1, description="the rank: at most the smaller side of each adapted layer")
    alpha: float = Field(default=16.0, gt=0.0, description="the update's scale is alpha / r")
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="on the adapter's input, in training")
    targets: list[LoRATarget] = Field(
        default=["attn.c_attn", "attn.c_proj"],
        min_length=1,
        description="the layers adapted in every block, the same in every recipe, by role or name: qkv "
        "(attn.c_attn: query, key and value), attention_output (attn.c_proj), mlp_up (mlp.c_fc: the MLP's "
        "up, and SwiGLU's gate), mlp_down (mlp.c_proj)",
    )

    train_embedding: bool = Field(
        default=False,
        description="the token embedding (and an untied output head) trains whole beside the adapters, as "
        "PEFT's modules_to_save: for a base given new tokens (a chat fine-tune sets it), whose rows must "
        "learn what they mean",
    )

    @field_validator("targets", mode="before")
    @classmethod
    def _by_role(cls, targets: Any) -> Any:
        """A role (`qkv`, ...) read as its layer's name; a name passes as it is; anything else is refused
        with both lists."""
        if not isinstance(targets, list):
            return targets
        known = (*ROLES, *get_args(LoRATarget))
        for target in targets:
            if target not in known:
                raise ValueError(f"{target!r} is no layer LoRA adapts: expected some of {', '.join(known)}")
        return [ROLES.get(target, target) for target in targets]


# The torchao formats a QLoRA base may be held in: int8 weight-only alone. The adapters' gradients flow
# back through the frozen base, and torch 2.13 has no backward for torchao's int4 weight-only CPU kernel
# (`_weight_int4pack_mm_for_cpu`).
QuantizedBase = Literal["int8-weight-only"]


class QLoRAConfig(LoRAConfig):
    """QLoRA: the same adapters, over a frozen base whose adapted layers' weights are held quantized
    (gptcore.finetune.qlora); the adapters and their optimizer state stay in full precision."""

    quantized_base: QuantizedBase = Field(
        default="int8-weight-only",
        description="the torchao weight-only format the adapted layers' frozen weights are held in",
    )


def adapter_settings(data: JSONObject) -> LoRAConfig:
    """LoRA or QLoRA settings from their dump (a job file, a checkpoint's identity): QLoRA's name the
    format of their quantized base."""
    kind = QLoRAConfig if "quantized_base" in data else LoRAConfig
    return kind.model_validate(data)
