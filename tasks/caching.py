"""Stage caching on content fingerprints, with outputs checked on every cache hit.

Prefect's INPUTS policy hashes a `Path` by its string, so two runs over different files would share a
key. Each stage task here takes a `fingerprint` argument (a hash of input contents or upstream
fingerprints, the stage's parameters and the code version) and is keyed on it alone. A cache hit is only
trusted when every output file its manifest names still exists with the recorded sha256; otherwise the
stage runs again with `refresh_cache`, which overwrites the stale record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptcore.fingerprint import sha256_file

# A stage's manifest names its output files under this key: {path: sha256}.
FILES_KEY = "files"


def fingerprint_key(stage: str) -> Callable[[Any, dict[str, Any]], str]:
    """A Prefect `cache_key_fn`: `<stage>-<fingerprint>`, a safe file name in the result storage."""

    def key(_context: Any, parameters: dict[str, Any]) -> str:
        return f"{stage}-{parameters['fingerprint']}"

    key.__name__ = f"{stage}_fingerprint_key"
    return key


def file_record(*paths: str | Path) -> dict[str, str]:
    """The `files` entry of a manifest: each output path with its content hash."""
    return {str(path): sha256_file(path) for path in paths}


def stale_outputs(manifest: dict[str, Any]) -> list[str]:
    """Output files named by a cached manifest that are missing or whose content changed."""
    stale = []
    for path, digest in manifest.get(FILES_KEY, {}).items():
        if not Path(path).is_file() or sha256_file(path) != digest:
            stale.append(path)
    return stale


@dataclass
class StageOutcome:
    """What one stage did: its state for the report, its manifest and the seconds it took."""

    name: str
    state: str  # completed | cached | failed | skipped
    manifest: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    message: str = ""
    reran_because: list[str] = field(default_factory=list)


def run_cached(name: str, stage_task: Any, /, **arguments: Any) -> StageOutcome:
    """Run a cached stage task; a hit with missing or changed outputs runs it again and refreshes."""
    started = time.perf_counter()
    state = stage_task(**arguments, return_state=True)
    manifest = state.result()
    cached = state.name == "Cached"
    stale: list[str] = []
    if cached and (stale := stale_outputs(manifest)):
        state = stage_task.with_options(refresh_cache=True)(**arguments, return_state=True)
        manifest = state.result()
        cached = False
    return StageOutcome(
        name=name,
        state="cached" if cached else "completed",
        manifest=manifest,
        seconds=round(time.perf_counter() - started, 3),
        reran_because=stale,
    )
