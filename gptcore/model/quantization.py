"""Post-training quantization: a trained model's weights in fewer bits, for a smaller file and (where this
machine has the kernels) faster inference, at some cost in quality that the quantize stage measures.

Methods (`METHODS`):
- `fp32`: the trained model as it is, the reference of every comparison.
- `bf16`: every weight in bfloat16 (half the bytes; the arithmetic in bf16 too).
- `int8-weight-only`: torchao's `Int8WeightOnlyConfig`: each linear layer's weight in int8 with one scale
  per output row; activations stay floating point.
- `int8-dynamic`: torchao's `Int8DynamicActivationInt8WeightConfig`: int8 weights as above, and each
  token's activations quantized to int8 on the fly, so the matmul itself can run in int8.
- `int4-weight-only`: torchao's `PrototypeInt4WeightOnlyConfig` (its CPU int4 kernels, still under
  `torchao.prototype`): each linear layer's weight in 4 bits, one scale and zero point per group of input
  features; the group is the largest of 128, 64 and 32 that divides every layer's in-features, so a
  model's files always load back into the same shapes.

The torchao methods quantize the linear layers of the blocks only. The output head is the token embedding
(tied), an embedding lookup as much as a matmul: it stays floating point, stored once, so quantizing never
makes the file bigger by untying it.
"""

from __future__ import annotations

import copy
import importlib
import logging
import platform
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gptcore.model.gpt import GPT

METHODS = ("fp32", "bf16", "int8-weight-only", "int8-dynamic", "int4-weight-only")
TORCHAO_METHODS = ("int8-weight-only", "int8-dynamic", "int4-weight-only")  # saved with torch.save
INT4_GROUP_SIZES = (128, 64, 32)
REFERENCE = "fp32"
# The CPU flags that decide how fast int8 and bf16 run here (from /proc/cpuinfo).
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile")


def torchao() -> Any:
    """torchao, imported quietly: on a CPU build it warns of every CUDA kernel library it cannot load, and
    torch warns of an Enum it registers; neither concerns the int8 kernels used here."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        import torchao as module
        import torchao.quantization  # the Enum registration torch warns about happens here
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
    return module


def unavailable(method: str, device: str) -> str | None:
    """Why `method` cannot run on `device` with this build, or None when it can."""
    if method in TORCHAO_METHODS:
        if device not in ("cpu", "cuda"):
            return f"torchao's int8 kernels run on cpu and cuda, not {device}"
        try:
            torchao()
        except ImportError:
            return "torchao is not installed (pip install 'gptpipe[quant]')"
    if method == "int4-weight-only":
        if device != "cpu":
            return f"torchao's int4 weight-only kernels wired here are its CPU ones, not {device}'s"
        try:
            importlib.import_module("torchao.prototype.quantization.int4")
        except ImportError as error:
            return f"this torchao has no CPU int4 weight-only quantization ({error})"
    if method == "bf16" and device == "cuda" and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16"
    return None


def quantized(model: GPT, method: str) -> GPT:
    """A quantized copy of `model` (in evaluation mode); `model` itself is left as it is."""
    if method not in METHODS:
        raise ValueError(f"quantization method {method!r}: expected one of {', '.join(METHODS)}")
    copied = copy.deepcopy(model).eval()
    return apply(copied, method)


def apply(model: GPT, method: str) -> GPT:
    """Quantize `model` in place (a freshly built model before loading quantized weights, or a copy)."""
    if method == "bf16":
        return model.to(torch.bfloat16)
    if method in TORCHAO_METHODS:
        torchao()
        from torchao.quantization import quantize_

        quantize_(model, _torchao_config(method, model), filter_fn=_block_linear)
    return model


def _torchao_config(method: str, model: GPT) -> Any:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig

    if method == "int8-weight-only":
        return Int8WeightOnlyConfig(set_inductor_config=False)
    if method == "int4-weight-only":
        from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig

        return PrototypeInt4WeightOnlyConfig(group_size=int4_group_size(model), set_inductor_config=False)
    return Int8DynamicActivationInt8WeightConfig(set_inductor_config=False)


def int4_group_size(model: GPT) -> int:
    """The largest of `INT4_GROUP_SIZES` dividing every quantized layer's in-features: torchao leaves a
    layer it does not divide in floating point, silently, so none is allowed to be one."""
    widths = {m.in_features for name, m in model.named_modules() if _block_linear(m, name)}
    for size in INT4_GROUP_SIZES:
        if all(width % size == 0 for width in widths):
            return size
    raise NotImplementedError(
        f"int4-weight-only: no group size of {', '.join(map(str, INT4_GROUP_SIZES))} divides every layer's "
        f"in-features ({', '.join(map(str, sorted(widths)))})"
    )


def _block_linear(module: nn.Module, name: str) -> bool:
    return isinstance(module, nn.Linear) and name != "lm_head"  # the head is the tied embedding


def weight_bytes(model: nn.Module) -> int:
    """Bytes the weights take in memory, each tensor once (the tied head counted once)."""
    seen: set[int] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        total += _tensor_bytes(tensor)
    return total


def _tensor_bytes(tensor: torch.Tensor) -> int:
    inner = getattr(tensor, "__tensor_flatten__", None)
    if inner is None or type(tensor) in (torch.Tensor, nn.Parameter):
        return tensor.numel() * tensor.element_size()
    names, _ = inner()  # a torchao tensor subclass: the int8 data and its scales
    return sum(_tensor_bytes(getattr(tensor, name)) for name in names)


def cpu_features() -> dict[str, Any]:
    """What decides int8 and bf16 speed on this machine: the CPU, its flags, torch's kernels, versions."""
    flags: set[str] = set()
    model_name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "flags" and not flags:
                flags = set(value.split())
            elif key.strip() == "model name":
                model_name = value.strip()
    try:
        torchao_version = torchao().__version__
    except ImportError:
        torchao_version = "not installed"
    present = " ".join(flag for flag in CPU_FLAGS if flag in flags)
    return {
        "cpu": model_name,
        "cpu_flags": present or "none of " + " ".join(CPU_FLAGS),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "torchao": torchao_version,
        "threads": torch.get_num_threads(),
    }
