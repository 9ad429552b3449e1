"""Sampling text from a checkpoint: temperature and top-k over the model's next-token distribution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gptcore import checkpoint as ckpt
from gptcore.config import ModelConfig
from gptcore.errors import CheckpointError, ConfigError, DataError
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


MAX_NEW_TOKENS = 1024  # the most new tokens one request may ask for: the cap a served model states
# A served or logged model's settings when a request names none.
DEFAULT_COMPLETION = {"max_new_tokens": 40, "temperature": 0.8, "top_k": 50, "seed": 0}


class Completer:
    """A model and its tokenizer: prompts in, completions out (the CLI, the MLflow model, the server).
    Bad settings are a ConfigError naming the setting, its value and what is allowed."""

    def __init__(self, model: GPT, tokenizer: Any, max_new_tokens_cap: int = MAX_NEW_TOKENS) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens_cap = max_new_tokens_cap

    @classmethod
    def from_paths(cls, model: GPT, tokenizer_path: Path) -> Completer:
        from tokenizers import Tokenizer

        if not Path(tokenizer_path).is_file():
            raise DataError(f"{tokenizer_path}: tokenizer file not found")
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception:  # the Rust loader raises a bare Exception for any malformed file
            raise DataError(f"{tokenizer_path}: not a loadable tokenizer.json") from None
        if tokenizer.get_vocab_size() > model.config.vocab_size:
            raise DataError(
                f"{tokenizer_path}: tokenizer vocabulary {tokenizer.get_vocab_size()} exceeds the model's "
                f"{model.config.vocab_size}"
            )
        return cls(model, tokenizer)

    def complete(
        self,
        prompts: list[str],
        max_new_tokens: int = 100,
        temperature: float = 0.8,
        top_k: int | None = 50,
        seed: int = 0,
    ) -> list[str]:
        """One completion per prompt; temperature 0 is greedy. Seeded: the same call, the same text."""
        new_ids = self.complete_ids(prompts, max_new_tokens, temperature, top_k, seed)
        return [self.tokenizer.decode(ids) for ids in new_ids]

    def complete_ids(
        self, prompts: list[str], max_new_tokens: int, temperature: float, top_k: int | None, seed: int
    ) -> list[list[int]]:
        """The new token ids of each prompt's completion."""
        self._check(prompts, max_new_tokens, temperature, top_k)
        device = next(self.model.parameters()).device
        completions = []
        for prompt in prompts:
            generator = torch.Generator(device=device).manual_seed(seed)
            ids = self.tokenizer.encode(prompt).ids or [0]
            completions.append(sample(self.model, ids, max_new_tokens, temperature, top_k or None, generator))
        return completions

    def _check(self, prompts: Any, max_new_tokens: Any, temperature: Any, top_k: Any) -> None:
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise ConfigError("inputs: expected a list of prompt strings")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise ConfigError(f"max_new_tokens {max_new_tokens!r}: expected a whole number")
        if not 1 <= max_new_tokens <= self.max_new_tokens_cap:
            cap = self.max_new_tokens_cap
            raise ConfigError(f"max_new_tokens {max_new_tokens}: allowed from 1 to {cap} (this model's cap)")
        if not isinstance(temperature, int | float) or not 0 <= temperature <= 10:
            raise ConfigError(f"temperature {temperature!r}: allowed from 0 (greedy) to 10")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
            raise ConfigError(f"top_k {top_k!r}: expected a whole number, 0 for none")


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
    path = choose_checkpoint(directory, checkpoint)
    model, record = load_model(path)
    tokenizer_path = tokenizer_path or record.get("metadata", {}).get("tokenizer")
    if not tokenizer_path:
        raise DataError(f"{path}: the checkpoint names no tokenizer; pass --tokenizer PATH")
    completer = Completer.from_paths(model, Path(tokenizer_path))
    new_ids = completer.complete_ids([prompt], max_new_tokens, temperature, top_k, seed)[0]
    return {
        "checkpoint": str(path),
        "step": record.get("step"),
        "prompt": prompt,
        "completion": completer.tokenizer.decode(new_ids),
        "new_tokens": len(new_ids),
    }
