"""The held-out evaluation: a checkpoint measured on the test split, which nothing else ever reads.

The test split is never trained on, never used to choose the best checkpoint and never seen by the
smoke gate, so its loss is the honest estimate of how the model does on text it has not seen.

- `test_loss`: mean nats per token over every token of the test stream after its first, read in windows
  of `block_size` predicted tokens (the last window shorter), so every token is predicted exactly once.
- `test_bits_per_byte`: the summed nats / (ln 2 x the test documents' UTF-8 bytes), comparable across
  tokenizers and vocabulary sizes.
- a split of conversations (a loss mask beside its stream) is read in its own whole examples and scored on
  the assistant's tokens alone: nats per assistant token, bits per byte of the assistant's text.
- the unigram baseline on the same split (the training targets' token frequencies), in both units.
- samples: greedy and sampled continuations of a fixed list of prompts, the first tokens of the test
  split's first documents, so two models of one iteration answer the same prompts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gptcore.checkpoint.load import load_model
from gptcore.data.batches import open_examples, unigram_loss
from gptcore.data.tokenfile import TokenStream, check_tokenizer, open_tokens
from gptcore.errors import DataError
from gptcore.eval.config import EvaluateConfig
from gptcore.generate import sample
from gptcore.model.gpt import GPT
from gptcore.tools.records import JSONObject
from gptcore.train.validate import bits_per_byte

PROMPT_SCAN_TOKENS = 1 << 20  # the prompts come from the test stream's first documents


@dataclass(frozen=True)
class Sample:
    prompt: str
    greedy: str
    sampled: str


@dataclass(frozen=True)
class HeldOutRecord:
    """The evaluate stage's figures; the field names are the run-record names."""

    checkpoint: str
    step: int
    test_loss: float
    test_perplexity: float
    test_bits_per_byte: float | None
    unigram_test_loss: float
    unigram_test_bits_per_byte: float | None
    test_tokens: int  # tokens predicted
    test_text_bytes: int | None
    samples: list[Sample] = field(default_factory=list)

    def to_dict(self) -> JSONObject:
        return asdict(self)

    def samples_markdown(self) -> str:
        lines = [f"# Samples from {self.checkpoint} (step {self.step})", ""]
        for number, item in enumerate(self.samples, 1):
            lines += [
                f"## Prompt {number}",
                "```",
                item.prompt,
                "```",
                "Greedy:",
                "```",
                item.prompt + item.greedy,
                "```",
                "Sampled:",
                "```",
                item.prompt + item.sampled,
                "```",
                "",
            ]
        return "\n".join(lines)


@torch.no_grad()
def summed_nats(
    model: GPT, tokens: np.ndarray, batch_size: int, max_tokens: int | None = None
) -> tuple[float, int]:
    """Summed cross-entropy (nats) over every token of `tokens` after the first, and how many tokens
    that is; windows of `block_size` predictions in batches, the last window shorter."""
    block = model.config.block_size
    device = next(model.parameters()).device
    limit = len(tokens) if max_tokens is None else min(len(tokens), max_tokens + 1)
    predicted = limit - 1
    full = predicted // block
    total = 0.0
    for first in range(0, full, batch_size):
        count = min(batch_size, full - first)
        offsets = (np.arange(first, first + count)[:, None] * block) + np.arange(block + 1)
        windows = torch.from_numpy(np.asarray(tokens[offsets], dtype=np.int64)).to(device)
        total += _window_nats(model, windows)
    rest = predicted - full * block
    if rest:
        tail = torch.from_numpy(np.asarray(tokens[full * block : limit], dtype=np.int64)).to(device)
        total += _window_nats(model, tail[None, :])
    return total, predicted


def stream_bits_per_byte(stream: TokenStream, nats: float, predicted: int) -> float | None:
    """Bits per UTF-8 byte of `predicted` tokens of `stream` that cost `nats`: the whole stream over its
    text bytes, a prefix by the stream's tokens per byte; None without a manifest to say either."""
    manifest = stream.manifest
    if manifest is None or predicted == 0:
        return None
    whole = manifest.trained_tokens if manifest.trained_tokens is not None else len(stream) - 1
    if manifest.text_bytes and predicted == whole:
        return nats / (math.log(2) * manifest.text_bytes)
    return bits_per_byte(nats / predicted, manifest.tokens_per_byte)


@torch.no_grad()
def masked_nats(
    model: GPT, stream: TokenStream, batch_size: int, max_tokens: int | None = None
) -> tuple[float, int]:
    """Summed cross-entropy (nats) over the targets of a masked stream's examples (its first `max_tokens`
    tokens' worth of whole examples, or all), and how many targets that is."""
    from gptcore.data.batches import open_examples
    from gptcore.model.cross_entropy import trained_count

    examples = open_examples(stream, model.config.block_size, model.config.vocab_size, what="test")
    count = (
        examples.count if max_tokens is None else min(examples.count, max(1, max_tokens // examples.window))
    )
    device = next(model.parameters()).device
    total, targets = 0.0, 0
    for first in range(0, count, batch_size):
        indices = np.arange(first, min(first + batch_size, count))
        window = examples.gather(indices)
        wanted = examples.targets(indices, window).to(device)
        _, loss = model(window[:, :-1].to(device), wanted, loss_only=True)
        counted = int(trained_count(wanted))
        total, targets = total + float(loss.double()) * counted, targets + counted
    return total, targets


def stream_figures(
    model: GPT, stream: TokenStream, settings: EvaluateConfig
) -> tuple[float, float | None, int]:
    """(loss in nats per token, bits per byte, tokens predicted) of `model` on a token stream: its first
    `settings.max_tokens` tokens, or all of them (a masked stream: its targets alone, in whole examples)."""
    if stream.mask is not None:
        nats, predicted = masked_nats(model, stream, settings.batch_size, settings.max_tokens)
        if predicted == 0:
            raise DataError(f"{stream.path}: no target to evaluate in its examples")
        return nats / predicted, stream_bits_per_byte(stream, nats, predicted), predicted
    nats, predicted = summed_nats(model, stream.tokens, settings.batch_size, settings.max_tokens)
    if predicted == 0:
        raise DataError(f"{stream.path}: too few tokens to evaluate ({len(stream)})")
    return nats / predicted, stream_bits_per_byte(stream, nats, predicted), predicted


def _window_nats(model: GPT, windows: torch.Tensor) -> float:
    _, loss = model(windows[:, :-1], windows[:, 1:], loss_only=True)  # the mean over every predicted token
    return float(loss.double()) * windows[:, 1:].numel()


def held_out_prompts(stream: TokenStream, end_of_text: int, count: int, length: int) -> list[list[int]]:
    """The first `length` tokens of the first `count` test documents at least twice that long."""
    head = np.asarray(stream.tokens[:PROMPT_SCAN_TOKENS], dtype=np.int64)
    ends = np.flatnonzero(head == end_of_text)
    starts = np.concatenate([[0], ends + 1])
    prompts = []
    for start, end in zip(starts, np.append(ends, len(head)), strict=False):
        if end - start >= 2 * length:
            prompts.append(head[start : start + length].tolist())
        if len(prompts) == count:
            break
    return prompts


def evaluate_held_out(
    checkpoint: Path,
    train_tokens: Path,
    test_tokens: Path,
    tokenizer_path: Path,
    settings: EvaluateConfig,
    device: str = "cpu",
) -> HeldOutRecord:
    """Measure `checkpoint` on the test token file and draw its samples."""
    from tokenizers import Tokenizer

    model, record = load_model(checkpoint, device)
    vocab_size = model.config.vocab_size
    test = open_tokens(test_tokens)
    check_tokenizer(tokenizer_path, vocab_size, (test,))
    if test.manifest is not None and test.manifest.split != "test":
        raise DataError(f"{test_tokens}: holds the {test.manifest.split} split, not the held-out test split")
    loss, bits, predicted = stream_figures(model, test, settings)
    text_bytes = test.manifest.text_bytes if test.manifest else None
    block = model.config.block_size
    unigram = unigram_loss(
        open_examples(train_tokens, block, vocab_size),
        open_examples(test, block, vocab_size, what="test"),
        vocab_size,
    )
    tokens_per_byte = test.manifest.tokens_per_byte if test.manifest else None
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    end_of_text = test.manifest.end_of_text_id if test.manifest else None
    prompts = (
        held_out_prompts(test, end_of_text, settings.prompts, settings.prompt_tokens)
        if end_of_text is not None
        else []
    )
    return HeldOutRecord(
        checkpoint=str(checkpoint),
        step=int(record.step or 0),
        test_loss=loss,
        test_perplexity=math.exp(min(loss, 700.0)),
        test_bits_per_byte=bits,
        unigram_test_loss=unigram,
        unigram_test_bits_per_byte=bits_per_byte(unigram, tokens_per_byte),
        test_tokens=predicted,
        test_text_bytes=text_bytes,
        samples=[_sample(model, tokenizer, ids, settings) for ids in prompts],
    )


def _sample(model: GPT, tokenizer: Any, ids: list[int], settings: EvaluateConfig) -> Sample:
    greedy = sample(model, ids, settings.max_new_tokens, temperature=0.0)
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(settings.seed)
    sampled = sample(model, ids, settings.max_new_tokens, settings.temperature, settings.top_k, generator)
    return Sample(tokenizer.decode(ids), tokenizer.decode(greedy), tokenizer.decode(sampled))
