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
from typing import Any, TypeVar

from tasks.results import StageResult

R = TypeVar("R", bound=StageResult)


def fingerprint_key(stage: str) -> Callable[[Any, dict[str, Any]], str]:
    """A Prefect `cache_key_fn`: `<stage>-<fingerprint>`, a safe file name in the result storage."""

    def key(_context: Any, parameters: dict[str, Any]) -> str:
        return f"{stage}-{parameters['fingerprint']}"

    key.__name__ = f"{stage}_fingerprint_key"
    return key


@dataclass
class StageOutcome:
    """What one stage did: its state for the report, its result and the seconds it took."""

    name: str
    state: str  # completed | cached | failed | skipped
    result: StageResult | None = None
    seconds: float = 0.0
    message: str = ""
    reran_because: list[str] = field(default_factory=list)

    @property
    def figures(self) -> dict[str, Any]:
        return self.result.figures if self.result is not None else {}

    @property
    def outputs(self) -> list[str]:
        return self.result.outputs if self.result is not None else []


def run_cached(name: str, stage_task: Any, result_type: type[R], /, **arguments: Any) -> StageOutcome:
    """Run a cached stage task; a hit with missing or changed outputs runs it again and refreshes."""
    started = time.perf_counter()
    state = stage_task(**arguments, return_state=True)
    result = result_type.model_validate(state.result())
    cached = state.name == "Cached"
    stale: list[str] = []
    if cached and (stale := result.stale_outputs()):
        state = stage_task.with_options(refresh_cache=True)(**arguments, return_state=True)
        result = result_type.model_validate(state.result())
        cached = False
    return StageOutcome(
        name=name,
        state="cached" if cached else "completed",
        result=result,
        seconds=round(time.perf_counter() - started, 3),
        reran_because=stale,
    )
