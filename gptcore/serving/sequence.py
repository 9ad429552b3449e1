"""One prompt's completion while a server decodes it: how to sample it, its tokens and text, how it ends.

The decode loop hands each new token to `accept`, on its own thread; the sequence decodes its text,
finds a stop string or the end-of-text token, and passes what may be shown now to `on_event` (a delta of
text, and the finish reason once it ends). Text that could still turn into a stop string, or that ends
inside a character the next token completes, is held back until it cannot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from gptcore.generate import is_greedy

# stop and length as OpenAI names them; the others end a sequence nobody reads to the end.
FinishReason = Literal["stop", "length", "cancelled", "deadline", "error"]
REPLACEMENT = "\ufffd"  # what a byte-level tokenizer decodes half a character to


@dataclass(frozen=True)
class Sampling:
    """How one completion is sampled and when it stops (an OpenAI completions request's fields)."""

    max_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(eq=False)
class Sequence:
    """A prompt's token ids and the completion decoded from them so far."""

    prompt_ids: list[int]
    sampling: Sampling
    tokenizer: Any  # a `tokenizers.Tokenizer`
    end_of_text: int | None = (
        None  # the token that ends a text (finish reason stop), if the tokenizer has one
    )
    deadline: float | None = None  # time.monotonic() after which the sequence is dropped
    on_event: Callable[[str, FinishReason | None], None] = lambda delta, reason: None
    stream: bool = False  # its text is shown as it grows; else it is decoded once, at the end
    generated: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    cancelled: bool = False  # set by the server when its client left: dropped at the next step
    cached: int = 0  # positions of its context in the decoder's cache
    submitted_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    finished_at: float | None = None
    _sent: int = 0  # characters of `text` already handed out
    _generator: torch.Generator | None = None

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.generated

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def generator(self, device: torch.device) -> torch.Generator | None:
        """The sequence's own random numbers (seeded: the same request, the same completion, whatever
        else is decoded beside it); None when it is greedy."""
        if is_greedy(self.sampling.temperature):
            return None
        if self._generator is None:
            self._generator = torch.Generator(device=device)
            if self.sampling.seed is not None:
                self._generator.manual_seed(self.sampling.seed)
            else:
                self._generator.seed()
        return self._generator

    def accept(self, token: int) -> None:
        """The next token: the text grows, a stop string, the end-of-text token or the length ends it."""
        now = time.monotonic()
        self.first_token_at = self.first_token_at or now
        self.generated.append(token)
        if token == self.end_of_text:
            self.generated.pop()  # ends the text; not part of it
            return self.finish("stop")
        if self.stream or self.sampling.stop:  # else nobody looks at the text before the end
            self.text = self.tokenizer.decode(self.generated)
            stops = [index for stop in self.sampling.stop if (index := self.text.find(stop)) >= 0]
            if stops:
                self.text = self.text[: min(stops)]
                return self.finish("stop")
        if len(self.generated) >= self.sampling.max_tokens:
            return self.finish("length")
        if self.stream:
            self._emit(None)

    def finish(self, reason: FinishReason) -> None:
        if self.finished:
            return
        if not (self.stream or self.sampling.stop):
            self.text = self.tokenizer.decode(self.generated)
        self.finish_reason, self.finished_at = reason, time.monotonic()
        self._emit(reason)

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now > self.deadline

    def _emit(self, reason: FinishReason | None) -> None:
        end = len(self.text) if reason is not None else self._shown_up_to()
        delta, self._sent = self.text[self._sent : end], max(self._sent, end)
        if delta or reason is not None:
            self.on_event(delta, reason)

    def _shown_up_to(self) -> int:
        """How much of the text may be shown before the sequence ends: not a half character, nor a tail
        that is the start of a stop string."""
        end = len(self.text)
        while end > self._sent and self.text[end - 1] == REPLACEMENT:
            end -= 1
        shown = self.text[:end]
        held = [
            next((size for size in range(min(len(stop) - 1, end), 0, -1) if shown.endswith(stop[:size])), 0)
            for stop in self.sampling.stop
        ]
        return max(end - max(held, default=0), self._sent)
