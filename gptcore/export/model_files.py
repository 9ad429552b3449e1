"""A trained model as plain files: what a logged MLflow model (and an export) carries.

`model.safetensors` holds the weights alone (no optimizer, no pickled objects; the output head, tied to
the token embedding, stored once), `model_config.json` the architecture, and `tokenizer.json` the
tokenizer the model was trained with, and a chat model's `chat_template.jinja` (the template beside its
tokenizer travels with it). A quantized model (`gptcore.model.quantization`) adds
`quantization.json`
naming its method; an int8 one keeps its weights in `model.pt` instead (torchao's int8 tensors are not
plain tensors, which safetensors requires; `torch.load(weights_only=True)` reads them, nothing else).
Every command that reads model files reads them here: weights that pickle anything but tensors, or a
damaged file, are one DataError naming the file, and nothing in them runs.
"""

from __future__ import annotations

import json
import pickle
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gptcore.chat.template import CHAT_TEMPLATE_FILE
from gptcore.errors import DataError
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT

WEIGHTS = "model.safetensors"
INT8_WEIGHTS = "model.pt"
CONFIG = "model_config.json"
TOKENIZER = "tokenizer.json"
QUANTIZATION = "quantization.json"
# A LoRA fine-tune's adapter beside its merged weights (gptcore.checkpoint.merge writes the pair): what
# `gptpipe export --format peft` turns into PEFT's format and `--format hf-base` takes back out.
ADAPTER = "adapter.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class ModelFiles:
    weights: Path
    config: Path
    tokenizer: Path
    quantization: Path | None = None  # absent: the trained fp32 weights
    chat_template: Path | None = None  # a chat model's (gptcore.chat.template); absent: it cannot chat
    adapter: Path | None = None  # a merged LoRA fine-tune's adapter, its config beside it; absent: none

    @property
    def method(self) -> str:
        """The quantization the weights went through (`gptcore.model.quantization.METHODS`)."""
        return quantization_method(self.quantization)

    def missing(self) -> list[str]:
        """The names of the files a model needs that are not there (weights, config, tokenizer)."""
        return [path.name for path in (self.weights, self.config, self.tokenizer) if not path.is_file()]

    def as_dict(self) -> dict[str, str]:
        files = {"weights": self.weights, "config": self.config, "tokenizer": self.tokenizer}
        if self.quantization is not None:
            files["quantization"] = self.quantization
        if self.chat_template is not None:
            files["chat_template"] = self.chat_template
        if self.adapter is not None:
            files |= {"adapter": self.adapter, "adapter_config": self.adapter.with_name(ADAPTER_CONFIG)}
        return {name: str(path) for name, path in files.items()}


class Recorded(Protocol):
    """What a checkpoint's record (`gptcore.checkpoint.record.CheckpointRecord`) says of its tokenizer."""

    @property
    def metadata(self) -> dict[str, str]: ...


def checkpoint_tokenizer(record: Recorded) -> Path:
    """The tokenizer a checkpoint's record names; a DataError when it names none or it is gone."""
    named = record.metadata.get("tokenizer")
    if not named:
        raise DataError("the checkpoint names no tokenizer (train it with one: gptpipe run, or --tokenizer)")
    path = Path(named)
    if not path.is_file():
        raise DataError(f"{path}: the checkpoint's tokenizer file is not there")
    return path


def write_model_files(model: GPT, tokenizer: Path | None, folder: Path, method: str = "fp32") -> ModelFiles:
    """The model's weights, config and tokenizer (when there is one) as files in `folder`; `method` names
    the quantization `model` went through (`gptcore.model.quantization.METHODS`)."""
    import torch
    from safetensors.torch import save_model

    from gptcore.model.quantization import TORCHAO_METHODS

    folder.mkdir(parents=True, exist_ok=True)
    if method in TORCHAO_METHODS:
        weights = folder / INT8_WEIGHTS
        torch.save(model.state_dict(), weights)  # the tied head shares the embedding's storage: once
    else:
        weights = folder / WEIGHTS
        save_model(model, str(weights))  # keeps the tied pair's `lm_head.weight`, as safetensors requires
    return with_config(weights, model.config, tokenizer, folder, method)


def with_config(
    weights: Path, config: ModelConfig, tokenizer: Path | None, folder: Path, method: str
) -> ModelFiles:
    """The files beside the weights: the config, a copy of the tokenizer, the quantization's method."""
    config_file = folder / CONFIG
    config_file.write_text(json.dumps(config.model_dump(), indent=2), encoding="utf-8")
    copied = folder / TOKENIZER
    chat_template = None
    if tokenizer is not None:  # a model trained on synthetic tokens has none
        if Path(tokenizer).resolve() != copied.resolve():
            shutil.copyfile(tokenizer, copied)
        template = Path(tokenizer).with_name(CHAT_TEMPLATE_FILE)
        if template.is_file():  # a chat model's template travels with its tokenizer
            chat_template = folder / CHAT_TEMPLATE_FILE
            if template.resolve() != chat_template.resolve():
                shutil.copyfile(template, chat_template)
    quantization = None
    if method != "fp32":
        quantization = folder / QUANTIZATION
        quantization.write_text(json.dumps({"method": method}), encoding="utf-8")
    return ModelFiles(weights, config_file, copied, quantization, chat_template)


def model_files_in(folder: Path) -> ModelFiles:
    """The model files in `folder` (as `write_model_files` left them); some may be missing."""
    folder = Path(folder)
    quantization = folder / QUANTIZATION
    int8 = folder / INT8_WEIGHTS
    weights = int8 if int8.is_file() else folder / WEIGHTS
    named = quantization if quantization.is_file() else None
    template, adapter = folder / CHAT_TEMPLATE_FILE, folder / ADAPTER
    return ModelFiles(
        weights, folder / CONFIG, folder / TOKENIZER, named, template if template.is_file() else None,
        adapter if adapter.is_file() else None,
    )  # fmt: skip


def model_files_at(folder: Path) -> ModelFiles:
    """The model files of a local folder: model files, or an MLflow model folder (`artifacts/`)."""
    folder = Path(folder)
    return model_files_in(folder / "artifacts" if (folder / "artifacts").is_dir() else folder)


def quantization_method(quantization: Path | None) -> str:
    """The method a `quantization.json` names; fp32 without one."""
    if quantization is None:
        return "fp32"
    return json.loads(Path(quantization).read_text(encoding="utf-8"))["method"]


def read_model_files(
    weights: Path,
    config: Path,
    device: str = "cpu",
    quantization: Path | None = None,
    source: str | None = None,
) -> GPT:
    """The model the files hold, in evaluation mode (quantized as `quantization` says). Weights that are
    not plain tensors, or not this model's, are one DataError naming `source` (what the user named, such
    as `--model URI`) and the file (by default its path): nothing in them is run."""
    from gptcore.model.quantization import apply

    model = GPT(ModelConfig.model_validate(json.loads(Path(config).read_text(encoding="utf-8"))))
    method = quantization_method(quantization)
    model = apply(model.eval(), method)  # the quantized shapes and types the weights load into
    weights = Path(weights)
    _load_weights(model, weights, device, f"{source}: {weights.name}" if source else str(weights))
    return model.to(device).eval()


def _load_weights(model: GPT, weights: Path, device: str, shown: str) -> None:
    """`weights` into `model`: safetensors, or a pickle of tensors alone (`weights_only`)."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    try:
        if weights.suffix == ".safetensors":
            load_model(model, str(weights), device=device)
            return
        with warnings.catch_warnings():  # torch's note on a pickle protocol: the refusal below says enough
            warnings.simplefilter("ignore", UserWarning)
            state = torch.load(weights, map_location=device, weights_only=True)
        model.load_state_dict(state, assign=True)
    except pickle.UnpicklingError:  # weights_only met an object that is not a tensor: never run it
        raise DataError(
            f"{shown} holds objects other than tensors; refused unread (not a plain weights file: a pickle "
            "that would run code)"
        ) from None
    except (SafetensorError, OSError, EOFError, RuntimeError, KeyError, ValueError, TypeError) as error:
        # a damaged file, or another model's tensors: torch and safetensors say it many ways
        reason = f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"  # torch's: many lines
        raise DataError(f"{shown} cannot be loaded as this model's weights ({reason})") from None
    if model.config.tie_embeddings:  # assign=True loaded them as two parameters
        model.lm_head.weight = model.transformer.wte.weight
