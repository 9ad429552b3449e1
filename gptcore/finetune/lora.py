"""LoRA (Hu et al., 2021): a trained model adapted to new text through low-rank updates of its own
linear layers, the rest of it frozen.

An adapted layer computes `base(x) + dropout(x) · Aᵀ · Bᵀ · alpha/r`: the base weight W (out x in) stays
as it was and is never copied, A (r x in) starts random and B (out x r) at zero, so the adapted model
starts exactly where the base model is and trains r·(in + out) numbers a layer instead of in·out.
`merge_lora` folds each update into its weight (W + B·A·alpha/r), leaving a plain model of the base's
shape; `adapter_state_dict` keeps the adapters alone, a small file beside the merged model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gptcore.errors import ConfigError
from gptcore.finetune.config import LoRAConfig
from gptcore.finetune.qlora import dense_weight
from gptcore.model.config import ModelConfig

EMBEDDING_WEIGHTS = ("transformer.wte.weight", "lm_head.weight")  # `train_embedding`'s


class LoRALinear(nn.Module):
    """A frozen linear layer and its trainable low-rank update."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)  # the base weights: frozen, shared, never copied
        self.r, self.scale = r, alpha / r
        # torch.empty, not new_empty: a QLoRA base's weight is a torchao tensor that has no new_empty.
        like = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_a = nn.Parameter(torch.empty(r, base.in_features, **like))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, r, **like))  # zero: starts at the base
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))  # as nn.Linear initialises its weight
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = F.linear(F.linear(self.dropout(x), self.lora_a), self.lora_b)  # two thin matmuls, no B·A
        return self.base(x) + update * self.scale

    def delta(self) -> torch.Tensor:
        """The update as a weight: B·A·alpha/r (out x in)."""
        return (self.lora_b @ self.lora_a) * self.scale

    def merged(self) -> nn.Linear:
        """A plain linear layer computing what this one does (without dropout): W + B·A·alpha/r. Over a
        QLoRA base, W is the dequantized weight, the one the adapters were trained against."""
        base, weight = self.base, dense_weight(self.base)
        layer = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None)
        layer = layer.to(device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            layer.weight.copy_(weight + self.delta().to(weight.dtype))
            if base.bias is not None:
                layer.bias.copy_(base.bias)
        return layer


def apply_lora(model: nn.Module, settings: LoRAConfig) -> list[str]:
    """Freeze `model` and put an adapter on each targeted layer of every block (`settings.targets`, in
    the model's own terms: `attn.c_attn`, `mlp.c_fc`, ...); the names of the adapted layers. A target
    no block has, or a rank above a layer's smaller side, is a ConfigError naming the key."""
    model.requires_grad_(False)
    adapted = []
    for name, layer in _targeted(model, settings.targets):
        smaller = min(layer.in_features, layer.out_features)
        if settings.r > smaller:
            raise ConfigError(
                f"finetune.lora.r: value {settings.r} is not allowed: at most {smaller}, the smaller side "
                f"of {name} ({layer.out_features} x {layer.in_features})"
            )
        parent, attribute = _parent(model, name)
        setattr(parent, attribute, LoRALinear(layer, settings.r, settings.alpha, settings.dropout))
        adapted.append(name)
    if settings.train_embedding:  # the head tied to it trains with it; an untied one beside it
        for name in EMBEDDING_WEIGHTS:
            model.get_parameter(name).requires_grad_(True)
    return adapted


def _targeted(model: nn.Module, targets: list[str]) -> list[tuple[str, nn.Linear]]:
    """The plain linear layers whose names end with a target (`transformer.h.3.attn.c_attn`)."""
    found = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and any(name.endswith(f".{target}") for target in targets)
    ]
    missing = [t for t in targets if not any(name.endswith(f".{t}") for name, _ in found)]
    if missing:
        raise ConfigError(
            f"finetune.lora.targets: {', '.join(missing)} names no layer of this model: expected some of "
            "attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj"
        )
    return found


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, attribute = name.rpartition(".")
    return model.get_submodule(path), attribute


def lora_layers(model: nn.Module) -> list[tuple[str, LoRALinear]]:
    return [(name, module) for name, module in model.named_modules() if isinstance(module, LoRALinear)]


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its layer, in place: the model has the base's shape and parameters again,
    with the updated weights, and trains or saves like any other."""
    for name, layer in lora_layers(model):
        parent, attribute = _parent(model, name)
        setattr(parent, attribute, layer.merged())
    return model


def unmerge_lora(model: nn.Module, adapter: dict[str, torch.Tensor], settings: LoRAConfig) -> nn.Module:
    """The model an adapter applies to, from the model it was merged into, in place: each adapted weight
    less the update `LoRALinear.merged` added (the same B·A·alpha/r, so the base comes back to fp32's
    rounding; a QLoRA base's adapted layers as the dequantized weights the adapters trained against). A
    trained embedding, which the adapter carries whole, stays as trained."""
    scale = settings.alpha / settings.r
    with torch.no_grad():
        for name, lora_a in adapter.items():
            if name.endswith(".lora_a"):
                layer = name.removesuffix(".lora_a")
                weight = model.get_parameter(f"{layer}.weight")
                weight.sub_(((adapter[f"{layer}.lora_b"] @ lora_a) * scale).to(weight.dtype))
    return model


def adapter_state_dict(model: nn.Module, embedding: bool = False) -> dict[str, torch.Tensor]:
    """The adapters' weights alone (`<layer>.lora_a`, `<layer>.lora_b`; the embedding too when it
    trained: `embedding`), copied to the CPU."""
    state = adapter_weights(model.state_dict(), embedding)
    return {name: tensor.detach().cpu().clone() for name, tensor in state.items()}


def adapter_weights(state: dict[str, torch.Tensor], embedding: bool = False) -> dict[str, torch.Tensor]:
    """The adapters' entries of an adapted model's state (a checkpoint's `model`), with the embedding
    (and an untied head: a tied one is the embedding, stored once) when it trained (`embedding`)."""
    found = {name: tensor for name, tensor in state.items() if name.endswith((".lora_a", ".lora_b"))}
    if embedding:
        wte, head = (state[name] for name in EMBEDDING_WEIGHTS)
        found[EMBEDDING_WEIGHTS[0]] = wte
        if head.data_ptr() != wte.data_ptr():
            found[EMBEDDING_WEIGHTS[1]] = head
    return found


def check_adapters(config: ModelConfig, settings: LoRAConfig) -> None:
    """Adapt a weightless copy of the model (`meta` tensors): a target naming no layer or a rank too
    large is refused before anything trains, in the words `apply_lora` uses."""
    from gptcore.model.gpt import GPT

    with torch.device("meta"):
        apply_lora(GPT(config), settings)


def load_adapter(model: nn.Module, adapter: dict[str, torch.Tensor]) -> None:
    """Put saved adapter weights into a model `apply_lora` adapted with the same settings."""
    expected = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    if set(adapter) != expected:
        raise ConfigError(
            f"the adapter holds {len(adapter)} weights, this model's adapters {len(expected)}: "
            "adapt it with the settings the adapter was trained with (finetune.lora)"
        )
    model.load_state_dict(adapter, strict=False)


def trainable_parameters(model: nn.Module) -> tuple[int, float]:
    """(the parameters an optimizer trains, their share of all of them)."""
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trained, trained / total if total else 0.0
