"""Training examples: token streams cut into non-overlapping windows of `block_size + 1` tokens.

Example i is tokens[i*(T+1) : (i+1)*(T+1)]; its first T tokens are the input, its last T the targets.
An epoch is one pass over the examples in an order shuffled from (seed, epoch) alone, so the order of
any step is known without replaying the ones before it (what exact resume and, later, data-parallel
ranks need). An optimizer step takes the next `global_batch` examples of the order; the remainder of an
epoch that does not fill a step is dropped.
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

    def gather(self, indices: np.ndarray) -> torch.Tensor:
        """The windows of the given examples as one (len(indices), T+1) int64 tensor."""
        offsets = indices.astype(np.int64)[:, None] * self.window + np.arange(self.window, dtype=np.int64)
        return torch.from_numpy(np.asarray(self.stream.tokens[offsets], dtype=np.int64))

    def target_tokens(self) -> np.ndarray:
        """Every target token of every example, in order (for the unigram baseline)."""
        covered = np.asarray(self.stream.tokens[: self.token_count]).reshape(self.count, self.window)
        return covered[:, 1:].reshape(-1)


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

    def _host(self, indices: np.ndarray) -> torch.Tensor:
        window = self.examples.gather(indices)
        return window.pin_memory() if self.pin_memory else window

    def _to_device(self, window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        window = window.to(self.device, non_blocking=self.pin_memory)
        return window[:, :-1], window[:, 1:]

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
