"""Merging a LoRA fine-tune: the one step from the trainer's adapted checkpoints to a plain model.

A LoRA run's checkpoints hold the adapted model whole (frozen base and adapters) so that it resumes
exactly; nothing else reads them. `merge_checkpoint` folds the adapters into the weights
(W + B·A·alpha/r) and writes a plain checkpoint of the base's shape, which every reader (evaluation,
generation, model files, export, quantization) takes like any other; `write_adapter` keeps the adapters
alone beside it, a small file that reproduces the fine-tune on the base.

A QLoRA run's checkpoints hold its base's adapted layers quantized (gptcore.finetune.qlora). Its
adapters were trained against the dequantized weights Ŵ, not the base's own W, so they merge into Ŵ
(Ŵ + B·A·alpha/r): the merged model, a plain fp32 one, computes what the adapted model computed, which
the base's W plus the adapters would not.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from gptcore.checkpoint import files as ckpt
from gptcore.checkpoint.record import CheckpointRecord, MergedFrom
from gptcore.errors import CheckpointError
from gptcore.finetune.config import LoRAConfig, QLoRAConfig
from gptcore.finetune.lora import adapter_weights, merge_lora
from gptcore.finetune.start import adapt
from gptcore.model.gpt import GPT

MERGED = "merged"  # the folder, in a LoRA run's checkpoint folder, of its merged checkpoints
ADAPTER = "adapter.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def merge_checkpoint(checkpoint: Path, folder: Path) -> Path:
    """`folder/<name>.pt`: the adapted `checkpoint`'s model with its adapters merged, a plain checkpoint
    whose record keeps the step and losses and says what it was merged from (`merged_from`)."""
    checkpoint = Path(checkpoint)
    record = ckpt.checkpoint_metadata(checkpoint)
    settings = adapters_of(checkpoint, record)
    model = GPT(record.architecture(checkpoint))
    adapt(model, settings)  # QLoRA: quantized layers of the right shapes, which the load fills in
    model.load_state_dict(ckpt.load_checkpoint(checkpoint)["model"])
    merge_lora(model)
    config = {key: value for key, value in (record.config or {}).items() if not key.startswith("lora.")}
    source = MergedFrom(str(checkpoint.resolve()), record.sha256 or "", settings)
    # The record says what it was merged from; the file it is written as, its own (the writing says).
    plain = replace(record.unpublished(), config=config, merged_from=source)
    path, _ = ckpt.save_checkpoint(folder, checkpoint.stem, {"model": model.state_dict()}, plain)
    return path


def write_adapter(checkpoint: Path, folder: Path) -> Path:
    """The adapted `checkpoint`'s adapters alone (`adapter.safetensors`) and their settings
    (`adapter_config.json`: the method, r, alpha, dropout, targets, for QLoRA the quantized base's
    format, the base's weights sha256) in `folder`. A QLoRA adapter reproduces the fine-tune on the base
    quantized the same way (`gptcore.finetune.start.adapt`)."""
    from safetensors.torch import save_file

    record = ckpt.checkpoint_metadata(checkpoint)
    settings = adapters_of(Path(checkpoint), record)
    folder.mkdir(parents=True, exist_ok=True)
    adapter = adapter_weights(ckpt.load_checkpoint(checkpoint)["model"], settings.train_embedding)
    save_file({name: tensor.contiguous() for name, tensor in adapter.items()}, str(folder / ADAPTER))
    method = "qlora" if isinstance(settings, QLoRAConfig) else "lora"
    described = {
        "method": method,
        **settings.model_dump(),
        "base_weights_sha256": (record.config or {}).get("init.weights_sha256"),
    }
    (folder / ADAPTER_CONFIG).write_text(json.dumps(described, indent=2), encoding="utf-8")
    return folder / ADAPTER


def adapters_of(checkpoint: Path, record: CheckpointRecord) -> LoRAConfig:
    """The LoRA settings an adapted checkpoint trained with; a CheckpointError for a plain one."""
    settings = record.adapters
    if settings is None:
        raise CheckpointError(f"{checkpoint}: a plain model's checkpoint, no LoRA adapters in it to merge")
    return settings
