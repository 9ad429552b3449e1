"""The validation loss of the model being trained, and when it is due.

Every rank scores a contiguous share of the validation examples and the sums are added across ranks,
so each evaluation covers every example exactly once whatever the number of processes. The first one
also reports the unigram baseline (the loss a model that ignores context reaches on these examples).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from gptcore.data.batches import BatchLoader, ExampleSet, unigram_loss
from gptcore.distributed.group import all_reduce_sum, rank_range
from gptcore.model.cross_entropy import trained_count
from gptcore.runtime.decided import Runtime
from gptcore.train.job import TrainJob
from gptcore.train.records import EvalRecord


class Evaluator:
    def __init__(
        self,
        validation: ExampleSet | None,
        train: ExampleSet | None,
        runtime: Runtime,
        every: int,
        at_start: bool,
        world_size: int = 1,
        rank: int = 0,
    ) -> None:
        self.validation = validation
        self.train = train
        self.runtime = runtime
        self.every = every
        self.at_start = at_start
        self.world_size = world_size
        self.rank = rank
        self.unigram: float | None = None
        self.last_val_loss: float | None = None
        self.seconds = 0.0  # spent evaluating, in all: what a longer run's evaluations are priced by
        self.examples = 0  # evaluated, in all

    @classmethod
    def for_job(
        cls, job: TrainJob, validation: ExampleSet | None, train: ExampleSet | None, runtime: Runtime
    ) -> Evaluator:
        """The evaluator of `job`: its training section's schedule, its rank's share."""
        t = job.training
        return cls(validation, train, runtime, t.eval_every, t.eval_at_start, job.world_size, job.rank)

    def due(self, step: int, planned_steps: int) -> bool:
        """Every `every` steps during the run (the end always evaluates: `at_end`)."""
        return step % self.every == 0 and step < planned_steps

    def due_at_start(self, step: int) -> bool:
        return self.at_start and step == 0

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module, step: int) -> EvalRecord | None:
        """The evaluation record at `step`, or None without validation examples."""
        if self.validation is None:
            return None
        started = time.perf_counter()
        model.eval()
        loader = BatchLoader(self.validation, self.runtime.device, self.runtime.pin_memory, 0)
        batch = self.runtime.batch_size
        share = rank_range(self.validation.count, self.world_size, self.rank)
        indices = (np.arange(s, min(s + batch, share.stop)) for s in range(share.start, share.stop, batch))
        sums = torch.zeros(2, device=self.runtime.device, dtype=torch.float64)  # nats, targets
        for x, y in loader.batches(indices):
            with self.runtime.autocast():
                _, loss = model(x, y, loss_only=True)  # one piece of logits at a time
            targets = trained_count(y)  # every position, but a conversation's prompt has none
            sums += torch.stack([loss.double() * targets, targets.double()])
        model.train()
        nats, targets = all_reduce_sum(sums).tolist()  # waits for it
        self.last_val_loss = nats / max(targets, 1.0)
        self.seconds += time.perf_counter() - started
        self.examples += self.validation.count
        first = self.unigram is None
        if first:  # the baseline a model must beat, once per run
            self.unigram = unigram_loss(self.train, self.validation, model.config.vocab_size)
        manifest = self.validation.stream.manifest
        return EvalRecord(
            step=step,
            val_loss=self.last_val_loss,
            val_perplexity=math.exp(min(self.last_val_loss, 700.0)),
            val_bits_per_byte=bits_per_byte(
                self.last_val_loss, manifest.tokens_per_byte if manifest else None
            ),
            unigram_val_loss=self.unigram if first else None,
        )


def bits_per_byte(nats_per_token: float, tokens_per_byte: float | None) -> float | None:
    """A loss in bits per byte of text: comparable across tokenizers and vocabulary sizes, since a
    tokenizer with longer tokens has fewer, harder ones. None without the text's byte count."""
    if tokens_per_byte is None:
        return None
    return nats_per_token * tokens_per_byte / math.log(2)
