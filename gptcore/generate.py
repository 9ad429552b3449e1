"""Sampling text from a checkpoint: temperature and top-k over the model's next-token distribution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gptcore import checkpoint as ckpt
from gptcore.config import ModelConfig
from gptcore.errors import CheckpointError, DataError
from gptcore.model import GPT


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


@torch.no_grad()
def sample(
    model: GPT,
    ids: list[int],
    max_new_tokens: int,
    temperature: float = 0.8,
    top_k: int | None = 50,
    generator: torch.Generator | None = None,
) -> list[int]:
    """Continue `ids` by `max_new_tokens` tokens; temperature 0 takes the most likely token."""
    device = next(model.parameters()).device
    context = torch.tensor([ids], dtype=torch.long, device=device)
    for _ in range(max_new_tokens):
        logits, _ = model(context[:, -model.config.block_size :])
        logits = logits[:, -1, :].float()
        if temperature <= 0:
            following = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k:
                threshold = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                logits = logits.masked_fill(logits < threshold, float("-inf"))
            following = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
        context = torch.cat([context, following], dim=1)
    return context[0, len(ids) :].tolist()


def generate_text(
    directory: Path,
    prompt: str,
    tokenizer_path: Path | None = None,
    max_new_tokens: int = 100,
    temperature: float = 0.8,
    top_k: int | None = 50,
    seed: int = 0,
    checkpoint: str = "auto",
) -> dict[str, Any]:
    from tokenizers import Tokenizer

    path = choose_checkpoint(directory, checkpoint)
    model, record = load_model(path)
    tokenizer_path = tokenizer_path or record.get("metadata", {}).get("tokenizer")
    if not tokenizer_path:
        raise DataError(f"{path}: the checkpoint names no tokenizer; pass --tokenizer PATH")
    if not Path(tokenizer_path).is_file():
        raise DataError(f"{tokenizer_path}: tokenizer file not found")
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    if tokenizer.get_vocab_size() > model.config.vocab_size:
        raise DataError(
            f"{tokenizer_path}: tokenizer vocabulary {tokenizer.get_vocab_size()} exceeds the model's "
            f"{model.config.vocab_size}"
        )
    ids = tokenizer.encode(prompt).ids or [0]
    generator = torch.Generator().manual_seed(seed)
    new_ids = sample(model, ids, max_new_tokens, temperature, top_k, generator)
    return {
        "checkpoint": str(path),
        "step": record.get("step"),
        "prompt": prompt,
        "completion": tokenizer.decode(new_ids),
        "new_tokens": len(new_ids),
    }
