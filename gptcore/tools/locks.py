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
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

UNREADABLE = {"pid": "?", "host": "?", "started_at": "unknown (unreadable lock record)"}


def describe(holder: dict[str, Any]) -> str:
    """Who holds a lock, from its record: `PID 12 on host, started 2026-12-04 09:00:00 UTC`."""
    started = holder.get("started_at", "an unknown time")
    return f"PID {holder.get('pid', '?')} on {holder.get('host', '?')}, started {started}"


def read_record(path: Path) -> dict[str, Any]:
    """The holder record at `path`: {} when there is none, `UNREADABLE` when it cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError):
        return dict(UNREADABLE)
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return dict(UNREADABLE)
    return value if isinstance(value, dict) else dict(UNREADABLE)


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

    def holder(self) -> dict[str, Any]:
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
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now)),
            "started_unix": now,
            "command": " ".join(sys.argv)[:500],
        }
        # In place, not through a temporary: only the holder writes it, and a torn record reads as
        # UNREADABLE (a temporary beside checkpoints would look like a checkpoint being written).
        with open(self.record, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
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
