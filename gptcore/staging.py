"""Output folders that appear whole or not at all.

A stage writes into a hidden sibling `.<name>.partial-<pid>-*` and renames it into place when every file
is complete, so an interrupted stage never leaves a folder that looks finished. Partial folders left by
processes that died are removed the next time the same output is built.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from gptcore.disk_space import space_for
from gptcore.run_lock import process_alive

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
