"""Where a fine-tuning run starts: a trained model's weights (model files, as `gptcore.export.model_files`
writes them), and adapters on them when it trains with LoRA (with QLoRA, over the adapted layers'
weights quantized first). The trainer calls `start_from` on the model it built from the job's config,
before moving it to the device and making its optimizer, so the optimizer sees only what trains and a
checkpoint holds the adapted model whole (exact resume)."""

from __future__ import annotations

import json
from pathlib import Path

from torch import nn

from gptcore.errors import ConfigError
from gptcore.finetune.config import LoRAConfig, QLoRAConfig, adapter_settings
from gptcore.finetune.lora import apply_lora
from gptcore.finetune.qlora import check_available, quantize_base
from gptcore.model.config import ModelConfig
from gptcore.tools.fingerprint import sha256_file
from gptcore.tools.records import Settings


def start_from(
    model: nn.Module, config: ModelConfig, weights: Path | None, lora: LoRAConfig | None, device: str = "cpu"
) -> None:
    """Load `weights` (a model-files folder or its `model.safetensors`) into `model`, which must have
    their shape; then adapt it with `lora` when given (everything but the adapters frozen) for training
    on `device`."""
    if weights is not None:
        load_weights(model, config, Path(weights))
    if lora is not None:
        adapt(model, lora, device)


def adapt(model: nn.Module, settings: LoRAConfig, device: str = "cpu") -> None:
    """Put `settings`' adapters on `model`; for QLoRA, over the adapted layers' weights quantized (a
    ConfigError first where torchao or `device` cannot)."""
    if isinstance(settings, QLoRAConfig):
        check_available(settings, device)
        quantize_base(model, settings)
    apply_lora(model, settings)


def weights_file(weights: Path) -> Path:
    """The safetensors file of a model-files folder (or the file itself)."""
    from gptcore.export.model_files import model_files_in

    path = model_files_in(weights).weights if weights.is_dir() else weights
    if path.suffix != ".safetensors" or not path.is_file():
        raise ConfigError(
            f"{weights}: no fp32 model weights (model.safetensors) to start from: fine-tune a trained, "
            "unquantized model"
        )
    return path


def load_weights(model: nn.Module, config: ModelConfig, weights: Path) -> None:
    from safetensors.torch import load_model

    path = check_architecture(config, weights)
    load_model(model, str(path))


def saved_architecture(weights: Path) -> ModelConfig | None:
    """The architecture a model's files record beside its weights (`model_config.json`; None: none)."""
    saved = weights_file(weights).with_name("model_config.json")
    if not saved.is_file():
        return None
    return ModelConfig.model_validate(json.loads(saved.read_text(encoding="utf-8")))


def check_architecture(config: ModelConfig, weights: Path, named: str | None = None) -> Path:
    """The weights file of `weights`, when the architecture saved beside it is `config`'s in every field
    that decides what the weights compute (`ModelConfig.differences`: ReLU²'s weights have GELU's shapes);
    a ConfigError naming `model` (and the weights as `named`, else by their folder) otherwise."""
    path = weights_file(weights)
    theirs = saved_architecture(path)
    differs = theirs.differences(config) if theirs is not None else {}
    if differs:
        which = named or f"in {path.parent}"
        shown = ", ".join(f"{key} {saved} (this run: {ours})" for key, (saved, ours) in differs.items())
        raise ConfigError(
            f"model: the weights {which} are of another architecture: {shown}; set model to the "
            "architecture they were trained with"
        )
    return path


def start_identity(weights: Path | None, lora: LoRAConfig | None) -> Settings:
    """What a resume must match of where the run started: the weights' hash and the adapters' settings
    (QLoRA's with `lora.quantized_base`, so neither method resumes the other's run)."""
    identity: Settings = {}
    if weights is not None:
        identity["init.weights_sha256"] = sha256_file(weights_file(Path(weights)))
    if lora is not None:
        identity.update({f"lora.{key}": value for key, value in lora.model_dump().items()})
    return identity


def lora_of(identity: Settings) -> LoRAConfig | None:
    """The adapters a run's identity (a checkpoint's `config`) says it trained; None: no adapters."""
    settings = {
        key.removeprefix("lora."): value for key, value in identity.items() if key.startswith("lora.")
    }
    return adapter_settings(settings) if settings else None
