"""The run's checkpoints: when to save, writing them (rank 0 alone) and finding the one to resume from.

The folder is held under its run lock for the whole run, half-written files a killed writer left are
removed first, periodic checkpoints beyond `keep_last` are pruned, and `last_good` names the newest
periodic or final checkpoint, the one every stop message offers to resume from.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gptcore import checkpoint as ckpt
from gptcore.run_lock import RunLock


class Checkpointer:
    def __init__(self, directory: Path | None, every: int, keep_last: int, writes: bool) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.every = every
        self.keep_last = keep_last
        self.writes = writes and self.directory is not None  # rank 0 of a real (not dry) run
        self.saved: dict[str, str] = {}  # latest / best / final -> path
        self.seconds = 0.0  # spent writing, in all
        self.last_seconds = 0.0  # the latest write's
        self.last_good: str | None = None

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """The folder, locked against a second run, for the block."""
        if not self.writes:
            yield
            return
        with RunLock(self.directory):
            ckpt.remove_stale_temporaries(self.directory)  # a killed run's half-written files
            yield

    def due(self, step: int, planned_steps: int) -> bool:
        """A periodic checkpoint after this step (the end writes `final` instead)."""
        return step % self.every == 0 and step < planned_steps

    def save(self, kind: str, step: int, state: dict[str, Any], record: dict[str, Any]) -> Path | None:
        """Write checkpoint `kind` (step, best or final); None where this process writes none."""
        if not self.writes:
            return None
        name = ckpt.step_name(step) if kind == "step" else kind
        keep = self.keep_last if kind == "step" else None
        path, seconds = ckpt.save_checkpoint(self.directory, name, state, record, keep)
        self.seconds += seconds
        self.last_seconds = seconds
        self.saved["latest" if kind == "step" else kind] = str(path)
        if kind != "best":
            self.last_good = str(path)
        return path

    def newest_loadable(self) -> tuple[Path, dict[str, Any], dict[str, Any]] | None:
        """(path, record, state) of the checkpoint a resume continues from, or None."""
        return ckpt.load_latest_valid(self.directory)

    def latest(self) -> Path | None:
        return ckpt.latest_checkpoint(self.directory)
