"""One checkpoint directory, one run: an exclusive lock file naming its holder.

`<directory>/run.lock` is held with `fcntl.flock` for the life of the run. The kernel drops a flock when
its process ends in any way (`kill -9` included), so the lock is never wrongly held by the dead; the
file also records the holder's PID, host and start time, so a refused run can say who holds it, and a
record found under a free lock shows a run that died without releasing: taken over with a warning.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from gptcore.errors import CheckpointError
from gptcore.tools.processes import process_alive

LOCK_NAME = "run.lock"
log = logging.getLogger(__name__)


def _describe(holder: dict[str, Any]) -> str:
    started = holder.get("started_at", "an unknown time")
    return f"PID {holder.get('pid', '?')} on {holder.get('host', '?')}, started {started}"


class RunLock:
    """`with RunLock(directory):` — refuses a second holder with a CheckpointError naming the first."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        self._handle: Any = None
        self.took_over: dict[str, Any] | None = None  # the dead holder's record, when one was found

    @property
    def held(self) -> bool:
        return self._handle is not None

    def acquire(self) -> RunLock:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 — held until release()
        except OSError as error:
            raise CheckpointError(
                f"{self.path}: cannot create the run lock ({error.strerror or error})"
            ) from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._read(handle)
            handle.close()
            raise CheckpointError(
                f"{self.directory}: checkpoint directory is in use by another training run "
                f"({_describe(holder)}); wait for it to end or pass another --checkpoint-directory"
            ) from None
        previous = self._read(handle)
        if previous:
            self._warn_take_over(previous)
        self._write(handle)
        self._handle = handle
        return self

    def release(self) -> None:
        """Empty the record, then drop the lock (the file stays: unlinking a flocked file races)."""
        if self._handle is None:
            return
        try:
            self._handle.truncate(0)
            self._handle.flush()
        except OSError:
            pass  # the kernel still drops the lock below
        finally:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None

    def _warn_take_over(self, previous: dict[str, Any]) -> None:
        self.took_over = previous
        state = "no longer running"
        same_host = previous.get("host") == socket.gethostname()
        if same_host and isinstance(previous.get("pid"), int) and process_alive(previous["pid"]):
            state = "not holding its lock (its PID is in use again)"
        log.warning(
            "warning: %s: taking over the run lock left by %s, which is %s",
            self.directory,
            _describe(previous),
            state,
        )

    @staticmethod
    def _read(handle: Any) -> dict[str, Any]:
        handle.seek(0)
        text = handle.read()
        if not text.strip():
            return {}
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return {"pid": "?", "host": "?", "started_at": "unknown (unreadable lock record)"}
        return value if isinstance(value, dict) else {}

    @staticmethod
    def _write(handle: Any) -> None:
        now = time.time()
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now)),
            "started_unix": now,
            "command": " ".join(sys.argv)[:500],
        }
        handle.seek(0)
        handle.truncate(0)
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()


def read_holder(directory: Path | str) -> dict[str, Any]:
    """The record in a directory's lock file ({} when free or absent); for messages and tests."""
    path = Path(directory) / LOCK_NAME
    try:
        text = path.read_text(encoding="utf-8")
        return json.loads(text) if text.strip() else {}
    except (OSError, json.JSONDecodeError):
        return {}
