"""Files that appear whole or not at all: written to a hidden temporary sibling, synced, renamed over.

A reader never sees half a file, and a writer that fails or is killed leaves the previous file as it
was (a killed one leaves its `.NAME.tmp-PID`, which the next writer of the folder may remove).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def temporary_sibling(target: Path) -> Path:
    return target.with_name(f".{target.name}.tmp-{os.getpid()}")


def write_atomic(
    target: str | Path, write: Callable[[IO[bytes]], Any], before_rename: Callable[[], None] | None = None
) -> Path:
    """`write(handle)` into a temporary sibling, fsync, rename over `target`; no partial file remains.
    `before_rename` runs between the sync and the rename (the fault tests hold a write open there)."""
    target = Path(target)
    temporary = temporary_sibling(target)
    try:
        with open(temporary, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return target


def write_text_atomic(target: str | Path, text: str) -> Path:
    return write_atomic(target, lambda handle: handle.write(text.encode("utf-8")))


def write_json_atomic(target: str | Path, value: Any, **dumps: Any) -> Path:
    """`value` as JSON (`dumps` passed to `json.dumps`, indent 2 unless given)."""
    return write_text_atomic(target, json.dumps(value, **{"indent": 2, **dumps}))
