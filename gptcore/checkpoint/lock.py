"""One checkpoint directory, one run: an exclusive lock, and a record naming its holder.

`<directory>/run.lock` is held for the life of the run (`gptcore.tools.locks`: the kernel drops it when
its process ends in any way, `kill -9` included). `run.lock.json` records the holder's PID, host and
start time, so a refused run can say who holds it; a record found under a free lock shows a run that
died without releasing: taken over with a warning.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from types import TracebackType

from gptcore.errors import CheckpointError
from gptcore.tools.locks import UNREADABLE, HeldLock, LockHolder, read_record
from gptcore.tools.processes import process_alive

LOCK_NAME = "run.lock"
HOLDER_NAME = "run.lock.json"  # the holder's record, beside the lock
log = logging.getLogger(__name__)


class RunLock:
    """`with RunLock(directory):` — refuses a second holder with a CheckpointError naming the first."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        self._lock = HeldLock(self.path)
        self.took_over: LockHolder | None = None  # the dead holder's record, when one was found

    @property
    def held(self) -> bool:
        return self._lock.held

    def acquire(self) -> RunLock:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            taken = self._lock.try_acquire()
        except OSError as error:
            raise CheckpointError(
                f"{self.path}: cannot create the run lock ({error.strerror or error})"
            ) from None
        if not taken:
            raise CheckpointError(
                f"{self.directory}: checkpoint directory is in use by another training run "
                f"({(self._lock.holder() or UNREADABLE).describe()}); wait for it to end or pass another "
                "--checkpoint-directory"
            )
        previous = self._lock.holder()
        if previous:
            self._warn_take_over(previous)
        try:
            self._lock.write_holder()
        except OSError as error:
            self._lock.release()
            raise CheckpointError(f"{self.path}: cannot record the run lock's holder ({error})") from None
        return self

    def release(self) -> None:
        self._lock.release()

    def _warn_take_over(self, previous: LockHolder) -> None:
        self.took_over = previous
        state = "no longer running"
        same_host = previous.host == socket.gethostname()
        if same_host and isinstance(previous.pid, int) and process_alive(previous.pid):
            state = "not holding its lock (its PID is in use again)"
        log.warning(
            "warning: %s: taking over the run lock left by %s, which is %s",
            self.directory,
            previous.describe(),
            state,
        )

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()


def read_holder(directory: Path | str) -> LockHolder | None:
    """The record of a directory's lock holder (None when free or absent); for messages and tests."""
    return read_record(Path(directory) / HOLDER_NAME)
