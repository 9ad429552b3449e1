"""The decode loop: one thread of its own runs every torch call of a server, between steps it lets
waiting sequences join, and it drops those whose client left or whose deadline passed.

Requests queue (`submit`, bounded: beyond the free rows and `max_queue` waiting sequences it refuses
with `QueueFull`, so nobody waits without end); at each step boundary as many join as there are free
rows, oldest first. A sequence that is cancelled or expires, waiting or running, frees its place at
the next boundary. One thread for the model because two threads with OpenMP teams on few cores slow
each other down for good (docs/benchmarks.md, Serving).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from gptcore.serving.decoder import BatchDecoder, StepReport
from gptcore.serving.sequence import Sequence

LOG = logging.getLogger("gptpipe.serving")


class QueueFull(Exception):
    """More sequences wait than the queue holds: the request is refused, to be retried later."""


class Observer(Protocol):
    """What the loop tells a server's metrics: what each step did and how long it took."""

    def stepped(self, report: StepReport) -> None: ...


class Scheduler:
    """The decode loop over the decoder `build` makes, on the loop's thread (the model is loaded where
    it will run)."""

    def __init__(
        self, build: Callable[[], BatchDecoder], max_queue: int, observer: Observer | None = None
    ) -> None:
        self.max_queue = max_queue
        self.observer = observer
        self.decoder: BatchDecoder | None = None
        self._build = build
        self._waiting: deque[Sequence] = deque()
        self._wake = threading.Condition()
        self._stopping = False
        self._held = False  # while held, waiting sequences stay waiting (`held`)
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="gptpipe-decode", daemon=True)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self.decoder.sequences) if self.decoder is not None else 0

    def start(self) -> Scheduler:
        """Start the loop once the decoder is built; what building it raised is raised here."""
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise self._failure
        return self

    def stop(self) -> None:
        """End the loop after its step; every sequence still waiting or running ends as cancelled."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join()

    @contextmanager
    def held(self) -> Iterator[None]:
        """No waiting sequence joins while held; running ones go on decoding. Whoever holds it decides
        who decodes together: sequences submitted meanwhile join at one step boundary, oldest first, as
        many as there are free rows."""
        with self._wake:
            self._held = True
        try:
            yield
        finally:
            with self._wake:
                self._held = False
                self._wake.notify()

    def submit(self, sequences: list[Sequence]) -> None:
        """Queue a request's sequences, all or none."""
        with self._wake:
            if self._stopping:
                raise QueueFull("the server is stopping")
            free = self.decoder.free if self.decoder is not None else 0  # they join at the next step
            if len(self._waiting) + len(sequences) > self.max_queue + free:
                raise QueueFull(f"{len(self._waiting)} sequences wait already (at most {self.max_queue})")
            self._waiting.extend(sequences)
            self._wake.notify()

    def cancel(self, sequences: list[Sequence]) -> None:
        """Their client left: dropped at the next step boundary (running) or before they join (waiting)."""
        for sequence in sequences:
            sequence.cancelled = True
        with self._wake:
            self._wake.notify()

    def _run(self) -> None:
        try:
            self.decoder = self._build()
        except BaseException as error:  # raised by `start`, in the caller's thread
            self._failure = error
        self._ready.set()
        if self.decoder is not None:
            self._loop(self.decoder)

    def _loop(self, decoder: BatchDecoder) -> None:
        while True:
            with self._wake:
                while not (self._stopping or (self._waiting and not self._held) or decoder.sequences):
                    self._wake.wait()
                if self._stopping:
                    break
                admitted = 0 if self._held else min(decoder.free, len(self._waiting))
                joining = [self._waiting.popleft() for _ in range(admitted)]
            now = time.monotonic()
            decoder.admit([sequence for sequence in joining if not _gone(sequence, now)])
            for sequence in decoder.sequences:
                _gone(sequence, now)
            decoder.drop_finished()
            self._step(decoder)
        for sequence in [*self._waiting, *decoder.sequences]:
            sequence.finish("cancelled")
        self._waiting.clear()
        decoder.drop_finished()

    def _step(self, decoder: BatchDecoder) -> None:
        if not decoder.sequences:
            return
        report = _guarded(decoder, decoder.step, decoder.sequences)
        if report is not None and self.observer is not None:
            self.observer.stepped(report)


def _gone(sequence: Sequence, now: float) -> bool:
    """End a sequence whose client left or whose deadline passed; whether it ended."""
    if sequence.cancelled or sequence.expired(now):
        sequence.finish("cancelled" if sequence.cancelled else "deadline")
    return sequence.finished


def _guarded(
    decoder: BatchDecoder, work: Callable[[], StepReport], sequences: list[Sequence]
) -> StepReport | None:
    """A step; when it fails (out of memory, a bug), its sequences end with `error`, the loop goes on
    for the others, and there is no report."""
    try:
        return work()
    except Exception:
        LOG.exception("decoding %d sequence(s) failed; they end with finish reason error", len(sequences))
        for sequence in sequences:
            sequence.finish("error")
        decoder.drop_finished()
        return None
