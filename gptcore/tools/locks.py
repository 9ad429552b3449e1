"""A lock file, and beside it a record of who holds it.

The lock is `filelock`'s (an `flock` on Unix: the kernel lets go when its holder ends in any way,
`kill -9` included, so the dead never hold it). `<lock>.json` records the holder's PID, host, start time
and command, so a refused caller can say who holds it, and a record found under a free lock shows a
holder that died without releasing.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from gptcore.tools.records import known_fields


@dataclass(frozen=True)
class LockHolder:
    """The record of who holds a lock (`<lock>.json`), its keys the fields' names."""

    pid: int | str = "?"  # the holder's process id; "?" where the record was unreadable
    host: str = "?"  # the machine it runs on
    started_at: str = "an unknown time"  # when it took the lock, local time, for a person
    started_unix: float | None = None  # the same as Unix time
    command: str | None = None  # its command line, cut at 500 characters

    def describe(self) -> str:
        """`PID 12 on host, started 2026-12-04 09:00:00 UTC`."""
        return f"PID {self.pid} on {self.host}, started {self.started_at}"


UNREADABLE = LockHolder(started_at="unknown (unreadable lock record)")


def read_record(path: Path) -> LockHolder | None:
    """The holder record at `path`: None when there is none, `UNREADABLE` when it cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        return UNREADABLE
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return UNREADABLE
    if not isinstance(value, dict):
        return UNREADABLE
    return LockHolder(**known_fields(LockHolder, value)) if value else None


class HeldLock:
    """`try_acquire()` or `acquire()` (waiting), then `release()`; the record is written on taking the
    lock and removed before letting go of it."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.record = self.path.with_name(self.path.name + ".json")
        self._lock = FileLock(str(self.path))

    @property
    def held(self) -> bool:
        return self._lock.is_locked

    def holder(self) -> LockHolder | None:
        return read_record(self.record)

    def try_acquire(self) -> bool:
        """Take the lock if it is free; False when someone holds it (this process included)."""
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            return False
        return True

    def acquire(self) -> None:
        """Take the lock, waiting as long as its holder keeps it."""
        self._lock.acquire()

    def write_holder(self) -> None:
        now = time.time()
        record = LockHolder(
            os.getpid(),
            socket.gethostname(),
            time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now)),
            now,
            " ".join(sys.argv)[:500],
        )
        # In place, not through a temporary: only the holder writes it, and a torn record reads as
        # UNREADABLE (a temporary beside checkpoints would look like a checkpoint being written).
        with open(self.record, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(asdict(record)) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def release(self) -> None:
        """Remove the record (a free lock has none), then let go of the lock."""
        if not self.held:
            return
        try:
            self.record.unlink(missing_ok=True)
        except OSError:
            pass  # the lock goes below all the same; the next holder takes the record over
        finally:
            self._lock.release()
