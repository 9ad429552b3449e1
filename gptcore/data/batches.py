"""Training examples: token streams cut into non-overlapping windows of `block_size + 1` tokens.

Example i is tokens[i*(T+1) : (i+1)*(T+1)]; its first T tokens are the input, its last T the targets.
An epoch is one pass over the examples in an order shuffled from (seed, epoch) alone, so the order of
any step is known without replaying the ones before it (what exact resume and, later, data-parallel
ranks need). An optimizer step takes the next `global_batch` examples of the order; the remainder of an
epoch that does not fill a step is dropped.

A stream with a loss mask (conversations: `gptcore.chat.tokens`) gives targets of `IGNORE` where the
mask is 0, so the model reads a prompt without being trained to write it; its examples are the stream's
own whole windows (`example_tokens`), which must be this model's `block_size + 1`.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gptcore.data.tokenfile import TokenStream, check_vocabulary, open_tokens
from gptcore.distributed.group import rank_micro_batches
from gptcore.errors import DataError
from gptcore.model.cross_entropy import IGNORE


@dataclass(frozen=True)
class ExampleSet:
    """A bounded view of a token stream as fixed-length examples."""

    stream: TokenStream
    block_size: int
    count: int

    @property
    def window(self) -> int:
        return self.block_size + 1

    def count_within(self, limit: int | None) -> int:
        """How many examples the stream holds under another run's `training_examples` limit."""
        return examples_in(len(self.stream), self.block_size, limit)

    @property
    def token_count(self) -> int:
        """Tokens the examples cover (what the model sees)."""
        return self.count * self.window

    @property
    def masked(self) -> bool:
        """Whether some positions have no target (the stream's loss mask)."""
        return self.stream.mask is not None

    def _offsets(self, indices: np.ndarray) -> np.ndarray:
        return indices.astype(np.int64)[:, None] * self.window + np.arange(self.window, dtype=np.int64)

    def gather(self, indices: np.ndarray) -> torch.Tensor:
        """The windows of the given examples as one (len(indices), T+1) int64 tensor."""
        return torch.from_numpy(np.asarray(self.stream.tokens[self._offsets(indices)], dtype=np.int64))

    def targets(self, indices: np.ndarray, window: torch.Tensor) -> torch.Tensor:
        """The targets of the examples whose `window` (from `gather`) is given: its last T tokens, each
        `IGNORE` where the loss mask says the model only reads it."""
        if self.stream.mask is None:
            return window[:, 1:]
        mask = torch.from_numpy(np.asarray(self.stream.mask[self._offsets(indices)[:, 1:]], dtype=np.bool_))
        return window[:, 1:].masked_fill(~mask, IGNORE)

    def target_tokens(self) -> np.ndarray:
        """Every target token of every example, in order (for the unigram baseline)."""
        covered = np.asarray(self.stream.tokens[: self.token_count]).reshape(self.count, self.window)
        targets = covered[:, 1:].reshape(-1)
        if self.stream.mask is None:
            return targets
        mask = np.asarray(self.stream.mask[: self.token_count]).reshape(self.count, self.window)
        return targets[mask[:, 1:].reshape(-1).astype(bool)]


def open_examples(
    source: str | Path | TokenStream,
    block_size: int,
    vocab_size: int,
    limit: int | None = None,
    what: str = "train",
) -> ExampleSet:
    """Open a token file (project file with manifest, bare uint16 `.bin`, or `.pt` tensor) as examples,
    refusing ids outside the vocabulary and streams too short for one example."""
    stream = source if isinstance(source, TokenStream) else open_tokens(source)
    check_vocabulary(stream, vocab_size)
    whole = stream.manifest.example_tokens if stream.manifest is not None else None
    if whole is not None and whole != block_size + 1:
        raise DataError(
            f"{stream.path}: holds examples of {whole} tokens (block_size {whole - 1}), not this model's "
            f"block_size + 1 = {block_size + 1}: build the token files for its block_size"
        )
    if examples_in(len(stream), block_size) == 0:
        raise DataError(
            f"{stream.path}: {len(stream)} {what} tokens hold no example of block_size + 1 = {block_size + 1}"
        )
    return ExampleSet(stream, block_size, examples_in(len(stream), block_size, limit))


def examples_in(tokens: int, block_size: int, limit: int | None = None) -> int:
    """The examples of block_size + 1 tokens (input and shifted target) that `tokens` hold, at most
    `limit`."""
    available = tokens // (block_size + 1)
    return available if limit is None else min(limit, available)


def epoch_order(count: int, seed: int, epoch: int) -> np.ndarray:
    """The seeded shuffled order of one epoch, independent of every other epoch."""
    return np.random.default_rng([seed, epoch]).permutation(count)


@dataclass(frozen=True)
class StepPlan:
    """How examples map onto optimizer steps: global batch = batch x accumulation x ranks."""

    batch_size: int
    grad_accum_steps: int
    world_size: int = 1
    rank: int = 0

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.grad_accum_steps * self.world_size

    def steps_per_epoch(self, count: int) -> int:
        return count // self.global_batch

    def micro_batch_indices(self, count: int, seed: int, start: int, stop: int) -> Iterator[np.ndarray]:
        """This rank's micro-batches of steps `start`..`stop - 1`, each epoch in its seeded order: the
        data of a step follows from (seed, step) alone, which is what makes a resume exact."""
        per_epoch = self.steps_per_epoch(count)
        order_of: tuple[int, np.ndarray] | None = None
        for step in range(start, stop):
            epoch, position = divmod(step, per_epoch)
            if order_of is None or order_of[0] != epoch:
                order_of = (epoch, epoch_order(count, seed, epoch))
            yield from self.micro_batches(order_of[1], position)

    def micro_batches(self, order: np.ndarray, step_in_epoch: int) -> list[np.ndarray]:
        """This rank's micro-batches (example indices) of one optimizer step; see
        `gptcore.distributed.group.rank_micro_batches` for why the step's examples do not depend on ranks."""
        return rank_micro_batches(
            order, step_in_epoch, self.batch_size, self.grad_accum_steps, self.world_size, self.rank
        )


class BatchLoader:
    """Turns index arrays into (inputs, targets) on the device, `workers` threads ahead of the step.

    On CUDA the host tensors are pinned and copied without blocking, so the copy overlaps compute.
    Threads suffice: the gather is a numpy memmap read, and order is kept by construction."""

    def __init__(self, examples: ExampleSet, device: str, pin_memory: bool, workers: int) -> None:
        self.examples = examples
        self.device = torch.device(device)
        self.pin_memory = pin_memory
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="batches") if workers > 0 else None
        self.lookahead = 2 * workers

    def _host(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The examples' windows, and their masked targets where the set has a loss mask (else None: the
        targets are a view of the window, moved with it)."""
        window = self.examples.gather(indices)
        targets = self.examples.targets(indices, window) if self.examples.masked else None
        if self.pin_memory:
            window = window.pin_memory()
            targets = targets.pin_memory() if targets is not None else None
        return window, targets

    def _to_device(self, host: tuple[torch.Tensor, torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor]:
        window = host[0].to(self.device, non_blocking=self.pin_memory)
        if host[1] is None:
            return window[:, :-1], window[:, 1:]
        return window[:, :-1], host[1].to(self.device, non_blocking=self.pin_memory)

    def batches(self, plan: Iterator[np.ndarray]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.pool is None:
            for indices in plan:
                yield self._to_device(self._host(indices))
            return
        pending: list[Future] = []
        for indices in plan:
            pending.append(self.pool.submit(self._host, indices))
            if len(pending) > self.lookahead:
                yield self._to_device(pending.pop(0).result())
        for future in pending:
            yield self._to_device(future.result())

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


def unigram_loss(train: ExampleSet, validation: ExampleSet, vocab_size: int) -> float:
    """Cross-entropy (nats/token) of the training targets' unigram frequencies, add-one smoothed, on the
    validation targets: the floor a model that ignores context reaches, which any model must beat."""
    counts = np.zeros(vocab_size, dtype=np.float64)
    train_targets = train.target_tokens()
    for start in range(0, len(train_targets), 1 << 21):  # bincount widens each slice to int64: 16 MiB
        counts += np.bincount(train_targets[start : start + (1 << 21)], minlength=vocab_size)
    log_probs = np.log(counts + 1.0) - np.log(counts.sum() + vocab_size)
    validation_counts = np.bincount(validation.target_tokens(), minlength=vocab_size)
    return float(-(validation_counts * log_probs).sum() / validation_counts.sum())
