"""Files and folders that appear whole or not at all.

A file is written to a hidden temporary sibling, synced and renamed over: a reader never sees half a
file, and a writer that fails or is killed leaves the previous file as it was (a killed one leaves its
`.NAME.tmp-PID`, which the next writer of the folder may remove).

A folder (a stage's output) is written into a hidden sibling `.<name>.partial-<pid>-*` and renamed into
place when every file is complete, so an interrupted stage never leaves a folder that looks finished.
Partial folders left by processes that died are removed the next time the same output is built.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from gptcore.tools.disk_space import space_for
from gptcore.tools.processes import process_alive


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


# --- folders ---------------------------------------------------------------------------------------

_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?:partial|stale)-(?P<pid>\d+)-")


def remove_abandoned(parent: Path, name: str) -> None:
    """Delete partial or stale copies of `name` whose writing process is gone."""
    for child in parent.glob(f".{name}.*"):
        match = _LEFTOVER.match(child.name)
        if match and match["name"] == name and not process_alive(int(match["pid"])):
            shutil.rmtree(child, ignore_errors=True)


@contextlib.contextmanager
def staging_directory(final: Path, needed: int | None = None) -> Iterator[Path]:
    """A fresh hidden folder beside `final`; removed on the way out unless it was published. Running out
    of disk space inside is one `DiskFullError` naming `final` and about the bytes `needed`."""
    parent = final.parent
    earlier = f"the earlier {final.name} is unchanged" if final.exists() else "nothing was published"
    kept = f"{earlier}; free space and run again"
    with space_for(final, needed, kept):
        parent.mkdir(parents=True, exist_ok=True)
        remove_abandoned(parent, final.name)
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-{os.getpid()}-", dir=parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the published folder should read like any other
    try:
        with space_for(final, needed, kept):
            yield staging
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def publish_directory(staging: Path, final: Path) -> None:
    """Rename the finished folder into place, replacing an older copy of the same output."""
    try:
        os.replace(staging, final)
        return
    except OSError:  # an older copy is in place (a folder is only replaced when empty): move it aside
        pass
    stale = final.with_name(f".{final.name}.stale-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    with contextlib.suppress(FileNotFoundError):
        os.replace(final, stale)
    os.replace(staging, final)
    shutil.rmtree(stale, ignore_errors=True)
