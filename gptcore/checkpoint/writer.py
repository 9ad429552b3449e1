"""Checkpoint writes off the training thread.

The training thread takes a snapshot of the state (every tensor copied to host memory: off the GPU on
CUDA, a copy the next step cannot change on CPU) and hands the file to a background thread, so the loop
waits for a memory copy instead of the disk. At most one write is in flight: the next save waits for it,
which bounds the host memory to one snapshot. A write's failure (a full disk, say) comes back on the
training thread at the next save, poll or close, as the error it was. Files are written atomically as
before, so a process killed mid-write leaves the previous checkpoint loadable.

The writer thread runs no torch compute (serialising and hashing bytes only): a torch parallel op on a
second OS thread would slow every later step of the training thread on a small CPU.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Written:
    """A checkpoint on disk, complete: where, what, and how long its write took."""

    path: Path
    kind: str
    step: int
    seconds: float


def snapshot(value: Any) -> Any:
    """`value` (a nested state dict) with every tensor copied to host memory, the rest deep-copied."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: snapshot(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(snapshot(item) for item in value)
    return copy.deepcopy(value)


class CheckpointWriter:
    """Runs each write on a background thread (or, with `background=False`, at once), one at a time."""

    def __init__(self, background: bool = True) -> None:
        self.background = background
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._done: list[Written] = []
        self._error: BaseException | None = None

    def submit(self, write: Callable[[], Written]) -> None:
        """Start `write` once the write in flight (if any) is done."""
        self.wait()
        if not self.background:
            self._done.append(write())
            return
        self._thread = threading.Thread(target=self._run, args=(write,), name="gptpipe-checkpoint-writer")
        self._thread.start()

    def _run(self, write: Callable[[], Written]) -> None:
        try:
            written = write()
        except BaseException as error:  # handed to the training thread, which raises it
            with self._lock:
                self._error = error
            return
        with self._lock:
            self._done.append(written)

    def wait(self) -> float:
        """Wait for the write in flight; raise its failure. Returns the seconds waited."""
        started = time.perf_counter()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise()
        return time.perf_counter() - started

    def finished(self) -> list[Written]:
        """The writes completed since the last call (raising a failed one's error first)."""
        self._raise()
        with self._lock:
            done, self._done = self._done, []
        return done

    def close(self, raise_errors: bool = True) -> None:
        """Let the write in flight finish. On the way out of a failed run its own failure is logged
        instead of raised, so it does not hide the error that stopped the run."""
        try:
            self.wait()
        except Exception as error:
            if raise_errors:
                raise
            log.warning("warning: the last checkpoint write failed too: %s", error)

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _raise(self) -> None:
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error
