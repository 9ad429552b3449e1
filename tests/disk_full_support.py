"""A disk that fills up, for the writers' tests: a write that puts some bytes down and then fails with
ENOSPC, as a real full disk does, injected at a chosen point of a writer."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def no_space() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def half_then_full(handle: IO[bytes]) -> None:
    """What a writer's callback does on a full disk: some bytes reach the file, then the error."""
    handle.write(b"half a file")
    raise no_space()


class FillingFile:
    """A file object whose writes fail with ENOSPC once `room` bytes are down."""

    def __init__(self, handle: IO[bytes], room: int) -> None:
        self.handle, self.room = handle, room

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        if size > self.room:
            self.handle.write(bytes(memoryview(data).cast("B")[: self.room]))
            raise no_space()
        self.room -= size
        return self.handle.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)

    def __enter__(self) -> FillingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.close()


def open_filling(name: str, room: int) -> Callable[..., Any]:
    """An `open` for a writer's module: the file called `name` fills after `room` bytes."""

    def opener(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = open(path, mode, *args, **kwargs)  # noqa: SIM115  (closed by FillingFile)
        return FillingFile(handle, room) if Path(path).name == name and "w" in mode else handle

    return opener


def leftovers(folder: Path) -> list[str]:
    """Hidden partial or temporary files and folders a writer left in `folder`."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below `folder` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
