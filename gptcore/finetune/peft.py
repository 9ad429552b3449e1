"""A LoRA fine-tune's adapter in PEFT's format: `adapter_config.json` and `adapter_model.safetensors`,
keyed by the Hugging Face export's module names, which `PeftModel.from_pretrained` loads onto the
exported base and vLLM's `--enable-lora` serves.

GPT-2's layout keeps gptpipe's module names and its fused `c_attn`: one adapter on the fused layer, over
the `Conv1D` weights PEFT reads with `fan_in_fan_out`. Llama's (Qwen3's) layout splits the fused linears
(`gptcore.export.hf_llama`), and an adapter on a fused layer splits with them exactly: the update B·A of
`c_attn` is, block of rows by block of rows, B_q·A, B_k·A, B_v·A, so q_proj, k_proj and v_proj each take
the same A and their block of B. A trained embedding (`finetune.lora.train_embedding`) travels whole as
PEFT's `modules_to_save`, the output head beside it: each copy PEFT makes is given the trained weights,
so a tied model computes as it was trained whether or not PEFT ties the copies again.

The base such an adapter applies to is the fine-tune's base (for QLoRA the base's adapted layers
dequantized: what the adapters were trained against; for chat the base grown to the chat tokens):
`gptcore.finetune.lora.unmerged` gives it back from the merged model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from gptcore.export.hf import check_output
from gptcore.export.hf_llama import FUSED_NAMES, LAYER_NAMES
from gptcore.finetune.config import LoRAConfig
from gptcore.finetune.lora import EMBEDDING_WEIGHTS
from gptcore.model.config import ModelConfig
from gptcore.tools.atomic import publish_directory, staging_directory
from gptcore.tools.records import JSONObject

PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."  # PEFT's: the wrapped model's module names follow it
ADAPTED = re.compile(r"transformer\.h\.(\d+)\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.lora_([ab])")


def _llama(config: ModelConfig) -> bool:
    return config.position == "rotary"  # gptcore.export.hf.layout: rotary models export as Llama's


def export_modules(config: ModelConfig, target: str) -> tuple[str, ...]:
    """The export's modules that hold a block's `target` (`attn.c_attn`): GPT-2's the same one, Llama's
    the split ones (`self_attn.q_proj`, ...)."""
    if not _llama(config):
        return (target,)
    return FUSED_NAMES[target] if target in FUSED_NAMES else (LAYER_NAMES[target],)


def _embedding_modules(config: ModelConfig) -> dict[str, str]:
    """gptpipe's embedding and head weights by the export's names for them."""
    embedding = "model.embed_tokens.weight" if _llama(config) else "transformer.wte.weight"
    return {EMBEDDING_WEIGHTS[0]: embedding, EMBEDDING_WEIGHTS[1]: "lm_head.weight"}


def peft_weights(adapter: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """gptpipe's adapter weights (`gptcore.finetune.lora.adapter_weights`) under PEFT's keys."""
    exported: dict[str, torch.Tensor] = {}
    blocks = "model.layers." if _llama(config) else "transformer.h."
    for name, tensor in adapter.items():
        match = ADAPTED.fullmatch(name)
        if match is None:
            continue  # the embedding and head: below
        modules = export_modules(config, match[2])
        # A is shared by the split modules; B's rows are stacked in their order (hf_llama.FUSED_NAMES)
        pieces = [tensor] * len(modules) if match[3] == "a" else tensor.chunk(len(modules))
        for module, piece in zip(modules, pieces, strict=True):
            key = f"{PREFIX}{blocks}{match[1]}.{module}.lora_{match[3].upper()}.weight"
            exported[key] = piece.detach().to("cpu", torch.float32).contiguous().clone()
    if EMBEDDING_WEIGHTS[0] in adapter:  # a tied head is the embedding: given to both copies
        embedding = adapter[EMBEDDING_WEIGHTS[0]]
        head = adapter.get(EMBEDDING_WEIGHTS[1], embedding)
        for ours, tensor in ((EMBEDDING_WEIGHTS[0], embedding), (EMBEDDING_WEIGHTS[1], head)):
            exported[PREFIX + _embedding_modules(config)[ours]] = tensor.to("cpu", torch.float32).clone()
    return exported


def peft_config(settings: LoRAConfig, config: ModelConfig, base: str | None = None) -> JSONObject:
    """PEFT's `LoraConfig` for the adapter, in the fields every PEFT release since 0.10 reads; `base`
    names the model it applies to (`base_model_name_or_path`)."""
    targets = sorted({module for target in settings.targets for module in export_modules(config, target)})
    saved = None
    if settings.train_embedding:
        saved = [name.rsplit(".", 2)[-2] for name in _embedding_modules(config).values()]
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": settings.r,
        "lora_alpha": settings.alpha,
        "lora_dropout": settings.dropout,
        "target_modules": targets,
        "fan_in_fan_out": not _llama(config),  # GPT-2's Conv1D stores its weight (in, out)
        "bias": "none",
        "modules_to_save": saved,
        "use_rslora": False,  # the scale is alpha / r, as gptcore.finetune.lora computes it
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
    }


def write_peft_adapter(
    adapter: dict[str, torch.Tensor],
    settings: LoRAConfig,
    config: ModelConfig,
    output: Path,
    base: str | None = None,
    force: bool = True,
) -> Path:
    """PEFT's two files in the folder `output`, published whole (a staging sibling renamed into place).
    An existing `output` is replaced only with `force`, and then only an earlier export (`check_output`).
    Returns the folder."""
    from safetensors.torch import save_file

    check_output(Path(output), force)
    weights = peft_weights(adapter, config)
    needed = sum(tensor.numel() * tensor.element_size() for tensor in weights.values())
    with staging_directory(Path(output), needed) as folder:
        save_file(weights, str(folder / PEFT_WEIGHTS), metadata={"format": "pt"})
        text = json.dumps(peft_config(settings, config, base), indent=2) + "\n"
        (folder / PEFT_CONFIG).write_text(text, encoding="utf-8")
        publish_directory(folder, Path(output))
    return Path(output)
