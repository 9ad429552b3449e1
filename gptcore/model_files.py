"""A trained model as plain files: what a logged MLflow model (and an export) carries.

`model.safetensors` holds the weights alone (no optimizer, no pickled objects; the output head, tied to
the token embedding, stored once), `model_config.json` the architecture, and `tokenizer.json` the
tokenizer the model was trained with.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from gptcore.config import ModelConfig
from gptcore.errors import DataError
from gptcore.model import GPT

WEIGHTS = "model.safetensors"
CONFIG = "model_config.json"
TOKENIZER = "tokenizer.json"


@dataclass(frozen=True)
class ModelFiles:
    weights: Path
    config: Path
    tokenizer: Path

    def as_dict(self) -> dict[str, str]:
        return {"weights": str(self.weights), "config": str(self.config), "tokenizer": str(self.tokenizer)}


def checkpoint_tokenizer(record: dict) -> Path:
    """The tokenizer a checkpoint's record names; a DataError when it names none or it is gone."""
    named = record.get("metadata", {}).get("tokenizer")
    if not named:
        raise DataError("the checkpoint names no tokenizer (train it with one: gptpipe run, or --tokenizer)")
    path = Path(named)
    if not path.is_file():
        raise DataError(f"{path}: the checkpoint's tokenizer file is not there")
    return path


def write_model_files(model: GPT, tokenizer: Path, folder: Path) -> ModelFiles:
    """The model's weights, config and tokenizer as files in `folder`."""
    from safetensors.torch import save_model

    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / WEIGHTS
    save_model(model, str(weights))  # drops the tied head's second name, as safetensors requires
    config = folder / CONFIG
    config.write_text(json.dumps(model.config.model_dump(), indent=2), encoding="utf-8")
    copied = folder / TOKENIZER
    shutil.copyfile(tokenizer, copied)
    return ModelFiles(weights, config, copied)


def read_model_files(weights: Path, config: Path, device: str = "cpu") -> GPT:
    """The model the files hold, in evaluation mode."""
    from safetensors.torch import load_model

    model = GPT(ModelConfig.model_validate(json.loads(Path(config).read_text(encoding="utf-8"))))
    load_model(model, str(weights), device=device)
    return model.to(device).eval()
