"""Continuous batching: sequences join the running batch between steps and leave when they end.

`admit` gives new sequences a row of the slot cache each; `step` runs one pass through the model: the
newest token of every decoding sequence, and packed after them the whole prompts of the admitted
sequences that fit the rest of the step's token budget (`step_tokens`), oldest first, so a short
prompt costs its own tokens' arithmetic and nothing more. A prompt too long for the budget goes in by
chunks, one a step in a pass of its own, so a long prompt arriving among decoding sequences delays their
next token by at most one budget of prefill, never by its whole length. A sequence whose prompt is in
takes its first token from that pass and decodes from the next step on. A sequence whose window is full
starts its row again from the last three quarters of its context, as `gptcore.generate.sample` does. A
finished, cancelled or expired sequence frees its row for the next (`drop`). Everything here runs on one
thread, the decode loop's (`gptcore.serving.scheduler`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from gptcore.generate import REFILL_KEEP, choose_next, is_greedy
from gptcore.model.gpt import GPT
from gptcore.model.slot_cache import SlotCache
from gptcore.serving.config import STEP_TOKENS
from gptcore.serving.sequence import FinishReason, Sequence

LOG = logging.getLogger("gptpipe.serving")


@dataclass(frozen=True)
class StepReport:
    """What one step did: its pass (the decoding rows and the prompts packed with them), and a long
    prompt's chunk in a pass of its own."""

    decoded: int  # sequences that took a token from the decode pass (the step's batch)
    decode_seconds: float  # the step's pass: the decoding rows and the whole prompts packed with them
    prefill_tokens: int  # prompt tokens run through the model (packed or in a chunk)
    prefill_seconds: float  # a long prompt's chunk, in a pass of its own
    first_tokens: int  # sequences whose prompt was all in: each took its first token

    @property
    def tokens(self) -> int:
        """New tokens the step gave its sequences."""
        return self.decoded + self.first_tokens


class BatchDecoder:
    """A model decoding up to `slots` sequences at once. `running[row]` decodes in rows `0..len-1`;
    `prefilling` holds the admitted sequences whose prompt is not all in yet, oldest first, in rows of
    their own past the running ones."""

    def __init__(self, model: GPT, slots: int, step_tokens: int = STEP_TOKENS) -> None:
        if step_tokens <= slots:
            raise ValueError(f"step_tokens {step_tokens} must exceed slots {slots}: prompts need room too")
        self.model = model.eval()
        self.window = model.config.block_size
        self.step_tokens = step_tokens
        self.device = next(model.parameters()).device
        self.cache = SlotCache(model.config.n_layer, self.window, slots, self.device)
        self.running: list[Sequence] = []
        self.prefilling: list[Sequence] = []
        self._rows: dict[int, int] = {}  # id(sequence) -> its row, for the prefilling ones
        self._free_rows = list(range(slots))  # every one past the decoding rows: the lowest is taken first

    @property
    def free(self) -> int:
        return self.cache.slots - len(self.running) - len(self.prefilling)

    @property
    def sequences(self) -> list[Sequence]:
        """Every sequence holding a row: decoding, then waiting for the rest of its prompt."""
        return [*self.running, *self.prefilling]

    def admit(self, sequences: list[Sequence]) -> None:
        """Give each sequence a row; its prompt (the last `block_size` tokens) goes in at the next steps."""
        if len(sequences) > self.free:
            raise RuntimeError(f"{len(sequences)} sequences, {self.free} free rows: admit at most `free`")
        for sequence in sequences:
            row = min(self._free_rows)
            self._free_rows.remove(row)
            self._rows[id(sequence)] = row
            sequence.cached = 0
            self.prefilling.append(sequence)

    @torch.no_grad()
    def step(self) -> StepReport:
        """One token of every decoding sequence, with the whole prompts that fit the rest of the budget
        packed into the same pass; else the next chunk of a prompt too long for it."""
        budget = self.step_tokens - len(self.running)
        whole = self._whole_prompts(budget)
        started = time.perf_counter()
        decoded = len(self.running)
        if self.running or whole:
            self._pass(whole)
        pass_seconds = time.perf_counter() - started
        prompt_tokens = sum(s.cached for s in whole)
        chunk_tokens, chunk_seconds, first_tokens = 0, 0.0, len(whole)
        if not whole and self.prefilling and budget > 0:
            started = time.perf_counter()
            chunk_tokens, finished = self._chunk(budget)
            chunk_seconds, first_tokens = time.perf_counter() - started, int(finished)
        self.drop_finished()
        return StepReport(decoded, pass_seconds, prompt_tokens + chunk_tokens, chunk_seconds, first_tokens)

    def drop(self, sequence: Sequence, reason: FinishReason) -> None:
        """End a sequence (its client left, its deadline passed) and free its row."""
        sequence.finish(reason)
        self.drop_finished()

    def drop_finished(self) -> None:
        """Free the rows of finished sequences; the last decoding row moves into a freed decoding row."""
        for sequence in [s for s in self.prefilling if s.finished]:
            self.prefilling.remove(sequence)
            self._free_rows.append(self._rows.pop(id(sequence)))
        for row in reversed(range(len(self.running))):
            if self.running[row].finished:
                last = len(self.running) - 1
                if row != last:
                    self.cache.move(last, row, self.running[last].cached)
                    self.running[row] = self.running[last]
                self.running.pop()
                self._free_rows.append(last)

    # --- the step's passes --------------------------------------------------------------------------

    def _pass(self, whole: list[Sequence]) -> None:
        """One token of every decoding sequence and the `whole` prompts, in one forward pass: each takes
        its next (or first) token."""
        for row, sequence in enumerate(self.running):
            if sequence.cached == self.window:  # the window is full: again from the context's last tokens
                keep = max(2, int(self.window * REFILL_KEEP))
                self._forward(row, 0, sequence.context[-keep:-1])  # the newest token is decoded below
                sequence.cached = keep - 1
        running, prompts = list(self.running), [self._prompt(sequence) for sequence in whole]
        longest = max((sequence.cached for sequence in running), default=0)
        newest = [sequence.context[-1] for sequence in running]
        if prompts:  # one packed row: the decoding rows' tokens, then every prompt's
            tokens = torch.tensor([newest + [t for p in prompts for t in p]], device=self.device)
            packed = [(self._rows[id(s)], len(p)) for s, p in zip(whole, prompts, strict=True)]
            logits = self.model(tokens, cache=self.cache.decode(len(running), longest, packed))[0][0]
        else:
            tokens = torch.tensor([[token] for token in newest], device=self.device)
            logits = self.model(tokens, cache=self.cache.decode(len(running), longest))[0][:, -1]
        logits = logits.float()
        greedy = logits.argmax(dim=-1).tolist()  # one call for every greedy row
        for index, sequence in enumerate(running):
            sequence.cached += 1
            self._take(sequence, logits[index : index + 1], greedy[index])
        for sequence, prompt in zip(whole, prompts, strict=True):
            sequence.cached = len(prompt)
        self._started(whole, logits[len(running) :], greedy[len(running) :])

    def _chunk(self, budget: int) -> tuple[int, bool]:
        """The next `budget` tokens of the oldest prompt, alone: its tokens run, and whether it is in."""
        oldest = self.prefilling[0]
        prompt = self._prompt(oldest)
        chunk = prompt[oldest.cached : oldest.cached + budget]
        logits = self._forward(self._rows[id(oldest)], oldest.cached, chunk)
        oldest.cached += len(chunk)
        if oldest.cached < len(prompt):
            return len(chunk), False
        self._started([oldest], logits, [int(logits.argmax(dim=-1))])
        return len(chunk), True

    # --- prompts -----------------------------------------------------------------------------------

    def _whole_prompts(self, budget: int) -> list[Sequence]:
        """The oldest prompts not yet begun whose tokens fit the budget together."""
        chosen: list[Sequence] = []
        for sequence in self.prefilling:
            size = len(self._prompt(sequence))
            if sequence.cached or size > budget:
                break
            chosen.append(sequence)
            budget -= size
        return chosen

    def _prompt(self, sequence: Sequence) -> list[int]:
        return sequence.context[-self.window :]

    def _started(self, sequences: list[Sequence], logits: torch.Tensor, greedy: list[int]) -> None:
        """Prompts all in: each sequence takes its first token and joins the decoding rows, which stay
        `0..running-1`: it takes row `running`, and whatever held that row takes its old one."""
        for index, sequence in enumerate(sequences):
            self.prefilling.remove(sequence)
            row, target = self._rows.pop(id(sequence)), len(self.running)
            if row != target:
                occupant = next((s for s in self.prefilling if self._rows[id(s)] == target), None)
                if occupant is None:  # the target row is free
                    self._free_rows.remove(target)
                    self.cache.move(row, target, sequence.cached)
                    self._free_rows.append(row)
                else:  # a prompt still going in holds it: the two swap rows
                    self.cache.swap(row, target, sequence.cached, occupant.cached)
                    self._rows[id(occupant)] = row
            self.running.append(sequence)
            self._take(sequence, logits[index : index + 1], greedy[index])

    def _forward(self, row: int, start: int, ids: list[int]) -> torch.Tensor:
        """The tokens `ids` from position `start` into `row`, in a pass of their own; their last logits."""
        tokens = torch.tensor([ids], dtype=torch.long, device=self.device)
        logits, _ = self.model(tokens, cache=self.cache.prefill(row, start))
        return logits[:, -1, :].float()

    def _take(self, sequence: Sequence, logits: torch.Tensor, greedy: int | None = None) -> None:
        """`sequence`'s next token from its row's logits; a failure to choose one (its logits not numbers)
        ends that sequence alone with `error`: the others of the step take theirs as they would have."""
        sampling = sequence.sampling
        if is_greedy(sampling.temperature):
            token = greedy if greedy is not None else int(logits.argmax(dim=-1))
        else:
            generator = sequence.generator(self.device)
            try:
                token = int(
                    choose_next(logits, sampling.temperature, sampling.top_k, generator, sampling.top_p)
                )
            except RuntimeError:  # torch's sampler refuses inf or NaN probabilities
                LOG.exception("sampling one sequence failed; it ends with finish reason error")
                sequence.finish("error")
                return
        sequence.accept(token)
