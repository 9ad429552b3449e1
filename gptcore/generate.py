"""Sampling text from a checkpoint: temperature and top-k over the model's next-token distribution."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gptcore.checkpoint.load import choose_checkpoint, load_model
from gptcore.errors import ConfigError, DataError
from gptcore.model.gpt import GPT
from gptcore.model.kv_cache import KVCache

# When the cache fills the window, sampling goes on from a new cache of the context's last three quarters:
# one prefill of 3/4 of the window every quarter window of new tokens (positions are absolute, so a
# full cache cannot slide by one).
REFILL_KEEP = 0.75


@torch.no_grad()
def sample(
    model: GPT,
    ids: list[int],
    max_new_tokens: int,
    temperature: float = 0.8,
    top_k: int | None = 50,
    generator: torch.Generator | None = None,
    kv_cache: bool = True,
    stop: frozenset[int] = frozenset(),
) -> list[int]:
    """Continue `ids` by `max_new_tokens` tokens, or until a token of `stop` (not returned: a chat model's
    end of turn); temperature 0 takes the most likely token.

    With `kv_cache` (the default) the prompt is run once and each new token costs one position; without
    it every step runs the whole context again (the reference the cache is tested against). The context
    the model sees is at most its window (`block_size`): without the cache, the last `block_size` tokens
    at every step; with it, a new cache of the last `REFILL_KEEP` of the window whenever the cache is
    full, so past the window the two may choose differently."""
    window = model.config.block_size
    device = next(model.parameters()).device
    context = torch.tensor([ids], dtype=torch.long, device=device)
    cache = None
    for _ in range(max_new_tokens):
        if not kv_cache:
            logits, _ = model(context[:, -window:])
        elif cache is None or cache.full:
            keep = window if cache is None else max(1, int(window * REFILL_KEEP))
            cache = KVCache(model.config.n_layer, window)
            logits, _ = model(context[:, -keep:], cache=cache)
        else:
            logits, _ = model(context[:, -1:], cache=cache)
        following = choose_next(logits[:, -1, :].float(), temperature, top_k, generator)
        if int(following) in stop:
            break
        context = torch.cat([context, following], dim=1)
    return context[0, len(ids) :].tolist()


# Below this a temperature samples as greedy, as vLLM's does: dividing the logits by less overflows float32
# to inf, whose softmax is NaN, which no sampler takes (a request's 1e-40 once failed every sequence of its
# server's decode step). The most likely token is what such a temperature asks for anyway.
GREEDY_BELOW = 1e-5


def is_greedy(temperature: float) -> bool:
    """Whether `temperature` takes the most likely token (0, or below `GREEDY_BELOW`)."""
    return temperature < GREEDY_BELOW


def choose_next(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None,
    generator: torch.Generator | None,
    top_p: float | None = None,
) -> torch.Tensor:
    """The next token of each row: the most likely at temperature 0 (below `GREEDY_BELOW`), else sampled
    from the top k and the smallest set of most likely tokens whose probabilities reach `top_p` (nucleus
    sampling)."""
    if is_greedy(temperature):
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k:
        threshold = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < threshold, float("-inf"))
    if top_p is not None and top_p < 1:
        ranked, order = torch.sort(logits, dim=-1, descending=True)
        probabilities = torch.softmax(ranked, dim=-1)
        beyond = probabilities.cumsum(dim=-1) - probabilities >= top_p  # the mass before it reached top_p
        ranked = ranked.masked_fill(beyond, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, ranked)
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)


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


@dataclass(frozen=True)
class Generated:
    """One prompt's completion by a checkpoint (`gptpipe generate`; `--json` prints its fields)."""

    checkpoint: str  # the checkpoint's path
    step: int | None  # the step it was written at
    prompt: str
    completion: str  # the new text alone
    new_tokens: int  # the tokens sampled


def generate_text(
    directory: Path,
    prompt: str,
    tokenizer_path: Path | None = None,
    max_new_tokens: int = 100,
    temperature: float = 0.8,
    top_k: int | None = 50,
    seed: int = 0,
    checkpoint: str = "auto",
) -> Generated:
    path = choose_checkpoint(directory, checkpoint)
    model, record = load_model(path)
    tokenizer_path = tokenizer_path or record.metadata.get("tokenizer")
    if not tokenizer_path:
        raise DataError(f"{path}: the checkpoint names no tokenizer; pass --tokenizer PATH")
    completer = Completer.from_paths(model, Path(tokenizer_path))
    new_ids = completer.complete_ids([prompt], max_new_tokens, temperature, top_k, seed)[0]
    return Generated(str(path), record.step, prompt, completer.tokenizer.decode(new_ids), len(new_ids))
