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

A merged checkpoint keeps its adapters' A and B (`adapter` beside `model`; a trained embedding is the
merged model's own), so the registered model made of it carries the adapter too
(`gptcore.checkpoint.load.checkpoint_model_files`), and `gptpipe export --format peft` writes it from
there as from the run's folder. The adapter's folder holds gptpipe's pair and PEFT's (`peft/`:
`gptcore.finetune.peft`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from gptcore.checkpoint import files as ckpt
from gptcore.checkpoint.record import CheckpointRecord, MergedFrom
from gptcore.errors import CheckpointError, DataError, first_line
from gptcore.export.model_files import ADAPTER, ADAPTER_CONFIG
from gptcore.finetune.config import LoRAConfig, QLoRAConfig, adapter_settings
from gptcore.finetune.lora import EMBEDDING_WEIGHTS, adapter_weights, merge_lora
from gptcore.finetune.start import adapt
from gptcore.model.gpt import GPT

MERGED = "merged"  # the folder, in a LoRA run's checkpoint folder, of its merged checkpoints
PEFT = "peft"  # the adapter's folder's sub-folder in PEFT's format (gptcore.finetune.peft)


def merge_checkpoint(checkpoint: Path, folder: Path) -> Path:
    """`folder/<name>.pt`: the adapted `checkpoint`'s model with its adapters merged, a plain checkpoint
    whose record keeps the step and losses and says what it was merged from (`merged_from`)."""
    checkpoint = Path(checkpoint)
    payload, record = ckpt.read_checkpoint(checkpoint)  # the record of these very weights
    settings = adapters_of(checkpoint, record)
    model = GPT(record.architecture(checkpoint))
    adapt(model, settings)  # QLoRA: quantized layers of the right shapes, which the load fills in
    state = payload["model"]
    model.load_state_dict(state)
    adapter = adapter_weights(state)  # A and B; a trained embedding is the merged model's own
    merge_lora(model)
    config = {key: value for key, value in (record.config or {}).items() if not key.startswith("lora.")}
    source = MergedFrom(str(checkpoint.resolve()), record.sha256 or "", settings)
    # The record says what it was merged from; the file it is written as, its own (the writing says).
    plain = replace(record.unpublished(), config=config, merged_from=source)
    payload = {"model": model.state_dict(), "adapter": adapter}
    path, _ = ckpt.save_checkpoint(folder, checkpoint.stem, payload, plain)
    return path


def write_adapter(checkpoint: Path, folder: Path) -> Path:
    """The adapters of `checkpoint` (an adapted one, or one merged from it) alone in `folder`: gptpipe's
    pair (`adapter.safetensors`; `adapter_config.json`: the method, r, alpha, dropout, targets, for QLoRA
    the quantized base's format, the base's weights sha256) and PEFT's in `folder/peft`. A QLoRA adapter
    reproduces the fine-tune on the base quantized the same way (`gptcore.finetune.start.adapt`), PEFT's
    on that base dequantized."""
    from gptcore.finetune.peft import write_peft_adapter

    adapter, settings, record = adapter_of(Path(checkpoint))
    written = write_adapter_files(adapter, settings, record, folder)
    write_peft_adapter(adapter, settings, record.architecture(Path(checkpoint)), folder / PEFT)
    return written


def adapter_of(checkpoint: Path) -> tuple[dict[str, torch.Tensor], LoRAConfig, CheckpointRecord]:
    """The adapter weights of an adapted checkpoint or of one merged from it (the embedding too when it
    trained), their settings and the checkpoint's record; a CheckpointError for any other."""
    state, record = ckpt.read_checkpoint(checkpoint)  # the record of these very weights
    source = record.merged_from
    if source is not None and "adapter" in state:
        return merged_adapter(state, source.adapters), source.adapters, record
    if source is not None:
        raise CheckpointError(
            f"{checkpoint}: merged by an earlier gptpipe, which kept no adapter beside the weights: merge "
            f"again (gptpipe merge --checkpoint-file {source.checkpoint})"
        )
    settings = adapters_of(checkpoint, record)
    return adapter_weights(state["model"], settings.train_embedding), settings, record


def merged_adapter(state: dict, settings: LoRAConfig) -> dict[str, torch.Tensor]:
    """A merged checkpoint's adapter (its `adapter`; the embedding, when it trained, from its model)."""
    adapter = dict(state["adapter"])
    if settings.train_embedding:
        model = state["model"]
        adapter[EMBEDDING_WEIGHTS[0]] = model[EMBEDDING_WEIGHTS[0]]
        head = model.get(EMBEDDING_WEIGHTS[1])
        if head is not None and head.data_ptr() != adapter[EMBEDDING_WEIGHTS[0]].data_ptr():
            adapter[EMBEDDING_WEIGHTS[1]] = head
    return adapter


def write_adapter_files(
    adapter: dict[str, torch.Tensor], settings: LoRAConfig, record: CheckpointRecord, folder: Path
) -> Path:
    """gptpipe's adapter pair in `folder` (`adapter.safetensors` and `adapter_config.json`)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.contiguous() for name, tensor in adapter.items()}, str(folder / ADAPTER))
    method = "qlora" if isinstance(settings, QLoRAConfig) else "lora"
    described = {
        "method": method,
        **settings.model_dump(),
        "base_weights_sha256": (record.config or {}).get("init.weights_sha256"),
    }
    (folder / ADAPTER_CONFIG).write_text(json.dumps(described, indent=2), encoding="utf-8")
    return folder / ADAPTER


def read_adapter_files(
    weights: Path, source: str | None = None
) -> tuple[dict[str, torch.Tensor], LoRAConfig]:
    """gptpipe's adapter pair as `write_adapter_files` wrote it (`weights`, its config beside it); files
    that cannot be read are one DataError naming `source` (what the user named) or their folder."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        described = json.loads(Path(weights).with_name(ADAPTER_CONFIG).read_text(encoding="utf-8"))
        fields = {
            key: value for key, value in described.items() if key not in ("method", "base_weights_sha256")
        }
        return load_file(str(weights)), adapter_settings(fields)
    except (OSError, ValueError, AttributeError, SafetensorError) as error:  # damaged, or not gptpipe's
        shown = f"{source}: {ADAPTER}" if source else str(Path(weights).parent)
        raise DataError(f"{shown}: the adapter's files cannot be read ({first_line(error)})") from None


def adapters_of(checkpoint: Path, record: CheckpointRecord) -> LoRAConfig:
    """The LoRA settings an adapted checkpoint trained with; a CheckpointError for a plain one."""
    settings = record.adapters
    if settings is None:
        raise CheckpointError(f"{checkpoint}: a plain model's checkpoint, no LoRA adapters in it to merge")
    return settings
