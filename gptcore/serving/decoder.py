"""Continuous batching: sequences join the running batch between decode steps and leave when they end.

`add` prefills a new sequence's prompt alone into a free row of the slot cache and takes its first
token from it; `step` runs one token of every running sequence through the model together and hands
each its next token. A sequence whose window is full starts its row again from the last three quarters
of its context, as `gptcore.generate.sample` does. A finished, cancelled or expired sequence frees its
row for the next (`drop`). Everything here runs on one thread, the decode loop's
(`gptcore.serving.scheduler`).
"""

from __future__ import annotations

import torch

from gptcore.generate import REFILL_KEEP, choose_next
from gptcore.model.gpt import GPT
from gptcore.model.slot_cache import SlotCache
from gptcore.serving.sequence import FinishReason, Sequence


class BatchDecoder:
    """A model decoding up to `slots` sequences at once; `running[row]` is the sequence in that row."""

    def __init__(self, model: GPT, slots: int) -> None:
        self.model = model.eval()
        self.window = model.config.block_size
        self.device = next(model.parameters()).device
        self.cache = SlotCache(model.config.n_layer, self.window, slots, self.device)
        self.running: list[Sequence] = []

    @property
    def free(self) -> int:
        return self.cache.slots - len(self.running)

    @torch.no_grad()
    def add(self, sequence: Sequence) -> None:
        """Prefill the sequence's prompt (its last `block_size` tokens) into a free row: its first token."""
        if self.free == 0:
            raise RuntimeError("no free row: add only while `free` is positive")
        row = len(self.running)
        self.running.append(sequence)
        logits = self._prefill(row, sequence.context[-self.window :])
        self._take(sequence, logits)
        self.drop_finished()

    @torch.no_grad()
    def step(self) -> None:
        """One new token of every running sequence, decoded together."""
        if not self.running:
            return
        for row, sequence in enumerate(self.running):
            if sequence.cached == self.window:  # the window is full: again from the context's last tokens
                keep = max(2, int(self.window * REFILL_KEEP))
                self._prefill(row, sequence.context[-keep:-1])  # the newest token is decoded below
        tokens = torch.tensor([[s.context[-1]] for s in self.running], dtype=torch.long, device=self.device)
        longest = max(sequence.cached for sequence in self.running)
        logits, _ = self.model(tokens, cache=self.cache.decode(len(self.running), longest))
        logits = logits[:, -1, :].float()
        greedy = logits.argmax(dim=-1).tolist()  # one call for every greedy row
        for row, sequence in enumerate(self.running):
            sequence.cached += 1
            self._take(sequence, logits[row : row + 1], greedy[row])
        self.drop_finished()

    def drop(self, sequence: Sequence, reason: FinishReason) -> None:
        """End a running sequence (its client left, its deadline passed) and free its row."""
        sequence.finish(reason)
        self.drop_finished()

    def drop_finished(self) -> None:
        """Free the rows of finished sequences, the last running row moved into each."""
        for row in reversed(range(len(self.running))):
            if self.running[row].finished:
                last = len(self.running) - 1
                if row != last:
                    self.cache.move(last, row)
                    self.running[row] = self.running[last]
                self.running.pop()

    def _prefill(self, row: int, ids: list[int]) -> torch.Tensor:
        tokens = torch.tensor([ids], dtype=torch.long, device=self.device)
        logits, _ = self.model(tokens, cache=self.cache.prefill(row))
        self.running[row].cached = len(ids)
        return logits[:, -1, :].float()

    def _take(self, sequence: Sequence, logits: torch.Tensor, greedy: int | None = None) -> None:
        sampling = sequence.sampling
        if sampling.temperature <= 0:
            token = greedy if greedy is not None else int(logits.argmax(dim=-1))
        else:
            generator = sequence.generator(self.device)
            token = int(choose_next(logits, sampling.temperature, sampling.top_k, generator, sampling.top_p))
        sequence.accept(token)
