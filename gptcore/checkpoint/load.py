"""A trained model from a checkpoint folder: which checkpoint (`final`, `best`, `latest`, `auto`) and
the model it holds, ready for inference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gptcore.checkpoint import files as ckpt
from gptcore.config import ModelConfig
from gptcore.errors import CheckpointError
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
    model = GPT(ModelConfig.model_validate(record["model_config"]))
    model.load_state_dict(ckpt.load_checkpoint(path)["model"])
    return model.to(device).eval(), record
