"""The outbox: a JSONL file of tracking records that wait for a store that is away.

Line 1 is a header (`{"gptpipe_outbox": 1, "tracking_uri": ..., "generation": ...}`: a new generation
at every rewrite, so a replay's saved progress is never read against another file); every later line is
one record of
`tasks.tracking.delivery.records`, oldest first. A `RunWriter` appends its oldest records here when
its memory bound is reached during an outage, reads them back first when the store returns, and at the
end of a run whose store never returned leaves every undelivered record here for `gptpipe tracking replay`.
Records are only appended or the whole file rewritten (`gptcore.tools.atomic`), so a kill leaves at
worst a torn last line, which reading skips.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from filelock import FileLock, Timeout

from gptcore.errors import GptpipeError
from gptcore.tools.atomic import write_atomic
from gptcore.tools.records import JSONObject
from tasks.tracking.delivery.operations import dumps
from tasks.tracking.delivery.records import Record, parse

FORMAT = 1


class OutboxError(GptpipeError):
    """A file that is not a readable gptpipe outbox."""

    exit_code = 2


class Outbox:
    """One outbox file and how far its records have been delivered (`offset`, `waiting`)."""

    def __init__(self, path: Path, tracking_uri: str = "", generation: str = "") -> None:
        self.path = Path(path)
        self.tracking_uri = tracking_uri
        self.generation = generation or uuid.uuid4().hex
        self.offset = 0  # where the first undelivered record starts (after the header)
        self.waiting = 0  # records from `offset` on
        self._lock = FileLock(str(self.path) + ".lock")

    @contextmanager
    def locked(self) -> Iterator[None]:
        """The outbox to oneself while the block runs; an OutboxError when a replay or the run writing it
        holds it."""
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise OutboxError(
                f"{self.path}: in use by another replay or by the run still writing it; try again later"
            ) from None
        try:
            yield
        finally:
            self._lock.release()

    def hold(self) -> None:
        """The writing run's claim on its outbox, from its first record to `release`."""
        if not self._lock.is_locked:
            self._lock.acquire(timeout=0)

    def release(self) -> None:
        while self._lock.is_locked:
            self._lock.release()

    @classmethod
    def open(cls, path: Path) -> Outbox:
        """An existing outbox, every record waiting; an OutboxError naming the file when it is not one."""
        path = Path(path)
        try:
            with path.open("rb") as handle:
                header = _header(path, handle.readline(LINE_LIMIT))
                uri, generation = header.get("tracking_uri") or "", header.get("generation") or "none"
                outbox = cls(path, str(uri), str(generation))
                outbox.offset = handle.tell()
                outbox.waiting = sum(1 for line in _lines(handle) if line.strip())
        except OSError as error:
            raise OutboxError(f"{path}: cannot read the outbox ({error.strerror or error})") from None
        return outbox

    def append(self, lines: Iterable[str]) -> int:
        """Append records (JSON lines) after the waiting ones, creating the file with its header."""
        lines = list(lines)
        if not lines:
            return 0
        fresh = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.hold()
        with self.path.open("a", encoding="utf-8") as handle:
            if fresh:
                handle.write(self._header_line())
                handle.flush()
                self.offset = handle.tell()
            handle.write("".join(line + "\n" for line in lines))
            handle.flush()
            os.fsync(handle.fileno())  # the records survive a kill once spilled
        self.waiting += len(lines)
        return len(lines)

    def read(self, limit: int) -> list[tuple[Record, int]]:
        """Up to `limit` waiting records from `offset`, each with the offset just after it."""
        if not self.waiting:
            return []
        records = []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            for line in _lines(handle):
                record = _record(line)
                if record is not None:
                    records.append((record, handle.tell()))
                    if len(records) == limit:
                        break
        if not records:  # only a torn last line was left
            self.waiting = 0
        return records

    def delivered(self, end: int, count: int) -> None:
        """Records up to `end` reached the store; the file goes when none wait."""
        self.offset, self.waiting = end, max(0, self.waiting - count)
        if not self.waiting:
            self.path.unlink(missing_ok=True)
            self.offset = 0

    def remaining(self) -> Iterator[Record]:
        """The waiting records, oldest first."""
        if not self.waiting:
            return
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            for line in _lines(handle):
                record = _record(line)
                if record is not None:
                    yield record

    def rewrite(self, records: Iterable[Record]) -> int:
        """Replace the file by `records` (written whole, then renamed over it); returns how many."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.generation = uuid.uuid4().hex  # another file from now on, for a saved replay progress
        header = self._header_line().encode("utf-8")
        count = 0

        def write(handle: IO[bytes]) -> None:
            nonlocal count
            handle.write(header)
            for record in records:
                handle.write((dumps(record) + "\n").encode("utf-8"))
                count += 1

        write_atomic(self.path, write)
        if not count:
            self.path.unlink(missing_ok=True)
        self.offset, self.waiting = (len(header) if count else 0), count
        return count

    def _header_line(self) -> str:
        header = {"gptpipe_outbox": FORMAT, "tracking_uri": self.tracking_uri, "generation": self.generation}
        return json.dumps(header) + "\n"


def _header(path: Path, line: bytes) -> JSONObject:
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict) or header.get("gptpipe_outbox") != FORMAT:
        raise OutboxError(
            f"{path}: not a gptpipe outbox (its first line should be "
            f'{{"gptpipe_outbox": {FORMAT}, ...}}); pass the file a run named in its warning'
        )
    return header


LINE_LIMIT = 16 << 20  # a record is a batch of params or a logged dict at most: never a whole file


def _lines(handle: IO[bytes]) -> Iterator[bytes]:
    """The file's lines from where the handle stands, each read at most `LINE_LIMIT` bytes at a time:
    a longer one (no record of gptpipe's) is passed over, never held whole."""
    while line := handle.readline(LINE_LIMIT + 1):
        if len(line) > LINE_LIMIT and not line.endswith(b"\n"):
            while (rest := handle.readline(LINE_LIMIT)) and not rest.endswith(b"\n"):
                pass
            continue
        yield line


def _record(line: bytes) -> Record | None:
    """The line's record; None for a torn last line of a killed process, nesting no record has, or JSON
    that is no record of gptpipe's."""
    try:
        return parse(json.loads(line))
    except (ValueError, RecursionError):
        return None
