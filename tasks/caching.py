"""Stage caching on content fingerprints, with outputs checked on every cache hit.

Prefect's INPUTS policy hashes a `Path` by its string, so two runs over different files would share a
key. Each stage task here takes a `fingerprint` argument (a hash of input contents or upstream
fingerprints, the stage's parameters and the code version) and is keyed on it alone. A cache hit is only
trusted when every output file its manifest names still exists with the recorded sha256; otherwise the
stage runs again with `refresh_cache`, which overwrites the stale record.

A record is plain JSON (`StageJSON`: a result's fields, no class names, nothing a reader imports or
calls). Prefect reads a record with whatever serializer the record itself names, pickle included, so a
record gptpipe did not write that way (planted in a shared `.prefect/storage`, or a pickle of an older
gptpipe) is set aside before Prefect sees it: the stage runs again and writes its own.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from prefect import task
from prefect.serializers import Serializer
from pydantic import BaseModel, Field

from tasks.results import StageResult

log = logging.getLogger(__name__)
RECORD_LIMIT = 16 << 20  # a stage's record is a small manifest: anything larger is not one of ours

R = TypeVar("R", bound=StageResult)


def fingerprint_key(stage: str) -> Callable[[Any, dict[str, Any]], str]:
    """A Prefect `cache_key_fn`: `<stage>-<fingerprint>`, a safe file name in the result storage."""

    def key(_context: Any, parameters: dict[str, Any]) -> str:
        return f"{stage}-{parameters['fingerprint']}"

    key.__name__ = f"{stage}_fingerprint_key"
    return key


class StageJSON(Serializer):
    """A stage's result as plain JSON; read back as plain data, which `run_cached` validates."""

    type: str = Field(default="gptpipe-stage-json", frozen=True)

    def dumps(self, obj: Any) -> bytes:
        data = obj.model_dump(mode="json") if isinstance(obj, BaseModel) else obj
        return json.dumps(data).encode("utf-8")

    def loads(self, blob: bytes) -> Any:
        return json.loads(blob)  # no object hook: nothing named in the data is imported or called


def stage_task(name: str) -> Callable[[Callable[..., Any]], Any]:
    """A pipeline stage as a Prefect task: keyed on its `fingerprint` argument, its result persisted
    as plain JSON."""
    return task(
        name=name, cache_key_fn=fingerprint_key(name), persist_result=True, result_serializer=StageJSON()
    )


def set_aside_untrusted_record(key: str) -> Path | None:
    """Move the stored record of `key` out of Prefect's way when it is not plain JSON written by
    `StageJSON` (a pickle runs code when read); where it went, or None when there was nothing to move."""
    from prefect.settings import get_current_settings

    path = Path(get_current_settings().results.local_storage_path).expanduser() / key
    if not path.is_file():
        return None
    try:
        with path.open("rb") as handle:
            record = json.loads(handle.read(RECORD_LIMIT + 1))
        trusted = record["metadata"]["serializer"]["type"] == StageJSON().type
    except (OSError, ValueError, KeyError, TypeError):
        trusted = False
    if trusted:
        return None
    aside = path.with_name(f".{path.name}.untrusted-{os.getpid()}")
    os.replace(path, aside)
    said = "warning: %s: a cached result not written as gptpipe's plain JSON; set aside as %s, it runs again"
    log.warning(said, path, aside.name)
    return aside


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
    set_aside_untrusted_record(stage_task.cache_key_fn(None, arguments))
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
