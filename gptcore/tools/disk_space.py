"""A full disk, answered in one line: which output, about how many bytes it needs, how many are free,
and what was kept. Every writer of large outputs (checkpoints, token files, exports) writes to a
temporary sibling first, so running out of space leaves no half file and the previous output intact;
these helpers turn the bare `OSError(ENOSPC)` into that message."""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

from gptcore.errors import DiskFullError

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # out of space, or out of the user's quota


def is_disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in NO_SPACE


def free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem holding `path` (its nearest existing folder)."""
    for folder in (Path(path), *Path(path).parents):
        if folder.exists():
            with contextlib.suppress(OSError):
                return shutil.disk_usage(folder).free
            return None
    return None


def megabytes(count: int | None) -> str:
    return "an unknown amount" if count is None else f"{count / 1e6:,.1f} MB"


def disk_full(target: Path, needed: int | None, kept: str) -> DiskFullError:
    """The one-line error for `target`, which needs about `needed` bytes; `kept` says what remains."""
    return DiskFullError(
        f"{target}: no space left on the disk: it needs about {megabytes(needed)}, "
        f"{megabytes(free_bytes(target))} are free there; the partial files were removed and {kept}"
    )


@contextlib.contextmanager
def space_for(target: Path, needed: int | None, kept: str) -> Iterator[None]:
    """Run the block; an out-of-space error inside it becomes `disk_full` (the others pass through)."""
    try:
        yield
    except OSError as error:
        if not is_disk_full(error):
            raise
        raise disk_full(target, needed, kept) from None
