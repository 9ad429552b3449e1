"""QLoRA (Dettmers et al., 2023): LoRA's adapters over a frozen base whose adapted layers' weights are held
quantized, so the base takes about a quarter of its fp32 memory there while the adapters, their gradients
and their AdamW moments stay in fp32.

`quantize_base` swaps each layer LoRA is about to adapt for a `QuantizedLinear`: the same layer, its weight
held in torchao's int8 weight-only format (an int8 per weight, a scale per output row).
`gptcore.finetune.start.adapt` runs it before `apply_lora` (after the base's weights are loaded, or before
a checkpoint's are), so each `LoRALinear.base` is one.

A QuantizedLinear's state is plain tensors (`weight.qdata`, `weight.scale`, `weight.zero_point`, `bias`):
a checkpoint loads with `torch.load(weights_only=True)`, resumes onto the very int8 values it trained over
(quantizing is deterministic, but the checkpoint does not rely on it), and merges without the base's
files, into the dequantized weight the adapted model computed with.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gptcore.errors import ConfigError
from gptcore.finetune.config import QLoRAConfig, QuantizedBase


class QuantizedLinear(nn.Linear):
    """A frozen linear layer computing x·Ŵᵀ + b, its weight Ŵ held quantized by torchao (`method`)."""

    def __init__(self, layer: nn.Linear, method: QuantizedBase) -> None:
        super().__init__(layer.in_features, layer.out_features, bias=layer.bias is not None, device="meta")
        self.method = method
        self.weight = nn.Parameter(_quantized(layer.weight.detach(), method), requires_grad=False)
        if layer.bias is not None:
            self.bias = nn.Parameter(layer.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FrozenQuantizedLinear.apply(x, self)

    def dequantized(self) -> torch.Tensor:
        """Ŵ as a plain tensor: the weight this layer computes with."""
        return self.weight.dequantize()

    def plain_state(self) -> dict[str, torch.Tensor]:
        """The tensors the quantized weight is made of, and the bias: its state, by name."""
        names, _ = self.weight.__tensor_flatten__()
        parts = {f"weight.{name}": getattr(self.weight, name) for name in names}
        state = {name: tensor for name, tensor in parts.items() if tensor is not None}
        if self.bias is not None:
            state["bias"] = self.bias
        return state

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        for name, tensor in self.plain_state().items():
            destination[prefix + name] = tensor if keep_vars else tensor.detach()

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        own = self.plain_state()
        for name, tensor in own.items():
            saved = state_dict.get(prefix + name)
            if saved is None:
                missing_keys.append(prefix + name)
            elif saved.shape != tensor.shape or saved.dtype != tensor.dtype:
                error_msgs.append(
                    f"{prefix + name}: a {saved.dtype} {tuple(saved.shape)} tensor in the state, "
                    f"{tensor.dtype} {tuple(tensor.shape)} in the model"
                )
            else:
                with torch.no_grad():
                    tensor.copy_(saved)
        if strict:
            unexpected_keys.extend(
                key for key in state_dict if key.startswith(prefix) and key.removeprefix(prefix) not in own
            )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self.method}"


class _FrozenQuantizedLinear(torch.autograd.Function):
    """A QuantizedLinear's output, its backward keeping the int8 weight alone. torchao's linear multiplies
    by `qdata.to(x.dtype)`, and autograd would keep that fp32 copy of every frozen weight until its
    backward: the memory the quantized base is there to save. Here the backward dequantizes again, one
    layer at a time. The frozen weight and bias get no gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: QuantizedLinear) -> torch.Tensor:
        ctx.layer = layer
        return F.linear(x, layer.weight, layer.bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad @ ctx.layer.dequantized().to(grad.dtype), None


def _quantized(weight: torch.Tensor, method: QuantizedBase) -> torch.Tensor:
    """`weight` (out x in) as torchao holds it in `method`: torchao quantizes modules, so a carrier
    module's."""
    from gptcore.model.quantization import torchao

    torchao()
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    carrier = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    carrier.weight = nn.Parameter(weight, requires_grad=False)
    configs = {"int8-weight-only": Int8WeightOnlyConfig(set_inductor_config=False)}
    quantize_(carrier, configs[method])
    return carrier.weight.detach()


def quantize_base(model: nn.Module, settings: QLoRAConfig) -> list[str]:
    """Hold the frozen weight of each layer `settings` adapts quantized (a `QuantizedLinear` in its place);
    the names of the layers quantized. Before `apply_lora`, which then adapts each of them."""
    suffixes = tuple(f".{target}" for target in settings.targets)
    names = [
        name
        for name, module in model.named_modules()
        if type(module) is nn.Linear and name.endswith(suffixes)  # not a QuantizedLinear already
    ]
    for name in names:
        path, _, attribute = name.rpartition(".")
        parent = model.get_submodule(path)
        setattr(parent, attribute, QuantizedLinear(getattr(parent, attribute), settings.quantized_base))
    return names


def quantized_weights(model: nn.Module) -> list[str]:
    """The names of `model`'s quantized weights. Data parallelism leaves them be: torch cannot broadcast a
    torchao tensor, and every rank quantizes the same base weights into the same ones."""
    return [f"{name}.weight" for name, module in model.named_modules() if isinstance(module, QuantizedLinear)]


def dense_weight(layer: nn.Linear) -> torch.Tensor:
    """A linear layer's weight as a plain tensor: a QuantizedLinear's dequantized, any other's itself."""
    return layer.dequantized() if isinstance(layer, QuantizedLinear) else layer.weight


def check_available(settings: QLoRAConfig, device: str) -> None:
    """A ConfigError, in one line, where this build (torchao) or `device` cannot hold the base quantized."""
    from gptcore.model.quantization import unavailable

    reason = unavailable(settings.quantized_base, device)
    if reason is not None:
        raise ConfigError(f"finetune.method: value qlora is not allowed: {reason}; allowed here: lora, full")
