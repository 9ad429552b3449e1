"""A trained model from a checkpoint folder: which checkpoint (`final`, `best`, `latest`, `auto`) and
the model it holds, ready for inference or as model files.

A LoRA fine-tune's checkpoint holds the adapted model whole (frozen base and adapters, for an exact
resume); read here it is merged (W + B·A·alpha/r), so every reader gets a plain model of the base's shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gptcore.checkpoint import files as ckpt
from gptcore.errors import CheckpointError
from gptcore.export.model_files import WEIGHTS, ModelFiles, checkpoint_tokenizer, with_config
from gptcore.finetune.lora import adapter_weights, apply_lora, merge_lora
from gptcore.finetune.start import lora_of
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT


def choose_checkpoint(directory: Path, name: str = "auto") -> Path:
    """`final`, `best`, `latest`, or `auto` (final, else the latest periodic one)."""
    directory = Path(directory)
    if name in ("final", "best"):
        path = ckpt.named_checkpoint(directory, name)
    elif name in ("latest", "auto"):
        path = (
            ckpt.named_checkpoint(directory, "final") if name == "auto" else None
        ) or ckpt.latest_checkpoint(directory)
    else:
        raise CheckpointError(f"--checkpoint {name!r}: expected auto, final, best or latest")
    if path is None:
        raise CheckpointError(
            f"{directory}: no {name} checkpoint there (train with --checkpoint-directory first)"
        )
    return path


def load_model(path: Path, device: str = "cpu") -> tuple[GPT, dict[str, Any]]:
    record = ckpt.checkpoint_metadata(path)
    model = _trained_model(record, ckpt.load_checkpoint(path)["model"])
    return model.to(device).eval(), record


def _trained_model(record: dict[str, Any], state: dict[str, Any]) -> GPT:
    """The model a checkpoint's state holds; a LoRA run's with its adapters merged."""
    model = GPT(ModelConfig.model_validate(record["model_config"]))
    adapters = lora_of(record.get("config", {}))
    if adapters is not None:
        apply_lora(model, adapters)
    model.load_state_dict(state)
    return merge_lora(model) if adapters is not None else model


def checkpoint_model_files(checkpoint: Path, folder: Path) -> tuple[ModelFiles, dict]:
    """A checkpoint's model files and its record. A pretraining checkpoint's weights are written without
    building the model: no arithmetic on tensors, so the thread that calls this (the tracking writer's)
    never starts an OpenMP team of its own, which would slow every later torch call of the process's
    main thread (docs/benchmarks.md, Serving). A LoRA checkpoint's adapters are merged first (one small
    product per adapted layer, once, at the end of a fine-tune)."""
    from safetensors.torch import save_file

    record = ckpt.checkpoint_metadata(checkpoint)
    state = ckpt.load_checkpoint(checkpoint)["model"]
    if lora_of(record.get("config", {})) is not None:
        state = _trained_model(record, state).state_dict()
    state.pop("transformer.wte.weight", None)  # tied to `lm_head.weight`: once, as `save_model` keeps it
    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / WEIGHTS
    save_file({name: tensor.contiguous() for name, tensor in state.items()}, str(weights))
    config = ModelConfig.model_validate(record["model_config"])
    return with_config(weights, config, checkpoint_tokenizer(record), folder, "fp32"), record


ADAPTER = "adapter.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def checkpoint_adapter(checkpoint: Path, folder: Path) -> Path | None:
    """A LoRA checkpoint's adapters alone (`adapter.safetensors`) and their settings
    (`adapter_config.json`: r, alpha, dropout, targets, the base's weights sha256) in `folder`: the
    unmerged fine-tune, a small file beside the merged model. None for any other checkpoint."""
    import json

    from safetensors.torch import save_file

    record = ckpt.checkpoint_metadata(checkpoint)
    settings = lora_of(record.get("config", {}))
    if settings is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    adapter = adapter_weights(ckpt.load_checkpoint(checkpoint)["model"])
    save_file({name: tensor.contiguous() for name, tensor in adapter.items()}, str(folder / ADAPTER))
    described = {**settings.model_dump(), "base_weights_sha256": record["config"].get("init.weights_sha256")}
    (folder / ADAPTER_CONFIG).write_text(json.dumps(described, indent=2), encoding="utf-8")
    return folder / ADAPTER
