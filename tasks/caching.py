"""Stage caching on content fingerprints, with outputs checked on every cache hit.

Prefect's INPUTS policy hashes a `Path` by its string, so two runs over different files would share a
key. Each stage task here takes a `fingerprint` argument (a hash of input contents or upstream
fingerprints, the stage's parameters and the code version) and is keyed on it alone. A cache hit is only
trusted when every output file its manifest names still exists with the recorded sha256; otherwise the
stage runs again and its record is replaced.

A record is plain JSON (`StageJSON`: a result's fields, no class names, nothing a reader imports or
calls), and gptpipe reads it itself. Prefect would read a record with whatever serializer the record
names, pickle included, and a record checked at its path and then read again from that path can be
swapped in between. So Prefect only writes records (a stage task runs with `refresh_cache`: its cache is
never looked up), and `run_cached` reads a record once, parses the bytes it read as plain JSON into the
stage's result type and uses them. Anything else there (a pickle planted in a shared `.prefect/storage`,
an older gptpipe's) is ignored with a warning: the stage runs again and writes its own. Prefect's UI shows
a hit as a task run of the stage's name in the Cached state.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.serializers import Serializer
from prefect.states import Completed, State
from pydantic import BaseModel, Field, ValidationError

from tasks.results import Figure, StageResult

log = logging.getLogger(__name__)
RECORD_LIMIT = 16 << 20  # a stage's record is a small manifest: anything larger is not one of ours

R = TypeVar("R", bound=StageResult)


def fingerprint_key(stage: str) -> Callable[[object, dict[str, object]], str]:
    """A Prefect `cache_key_fn`: `<stage>-<fingerprint>`, a safe file name in the result storage."""

    def key(_context: object, parameters: dict[str, object]) -> str:
        return f"{stage}-{parameters['fingerprint']}"

    key.__name__ = f"{stage}_fingerprint_key"
    return key


class StageJSON(Serializer):
    """A stage's result as plain JSON, as Prefect writes it; `read_record` reads it back."""

    type: str = Field(default="gptpipe-stage-json", frozen=True)

    def dumps(self, obj: Any) -> bytes:
        data = obj.model_dump(mode="json") if isinstance(obj, BaseModel) else obj
        return json.dumps(data).encode("utf-8")

    def loads(self, blob: bytes) -> Any:
        return json.loads(blob)  # no object hook: nothing named in the data is imported or called


def records_folder() -> Path:
    """Where stage records are kept: Prefect's local result storage (`.prefect/storage`), even when a
    server names another default storage, because gptpipe reads them there itself."""
    from prefect.settings import get_current_settings

    return Path(get_current_settings().results.local_storage_path).expanduser()


def stage_task(name: str, records: Path) -> Callable[[Callable[..., Any]], Any]:
    """A pipeline stage as a Prefect task: its result persisted as plain JSON under its `fingerprint`
    argument in `records` (`records_folder()` when the flow runs); Prefect never reads one back
    (`run_cached` does)."""
    return task(
        name=name,
        cache_key_fn=fingerprint_key(name),
        refresh_cache=True,
        persist_result=True,
        result_storage=records,
        result_serializer=StageJSON(),
    )


@task(name="cached", cache_policy=NO_CACHE, persist_result=False)
def shown_cached(record: str) -> State:
    """A cache hit in Prefect's UI: a task run (of the stage's name) in the Cached state, nothing run."""
    return Completed(name="Cached", message=f"the result recorded in {record}")


def read_record(path: Path, result_type: type[R]) -> R | None:
    """The result recorded at `path`, from one read: the bytes read are the bytes parsed, as plain JSON.
    None when there is none; a record that is not gptpipe's (or not a `result_type`) is ignored with a
    warning, and nothing else reads it."""
    try:
        with path.open("rb") as handle:
            blob = handle.read(RECORD_LIMIT + 1)
    except FileNotFoundError:
        return None
    except OSError as error:
        return _ignored(path, f"an unreadable cached result ({error.strerror})")
    try:
        data = _stage_json_result(blob)
    except (ValueError, KeyError, TypeError, RecursionError):
        return _ignored(path, "a cached result that is not gptpipe's plain JSON record")
    try:
        return result_type.model_validate(data)
    except ValidationError:
        return _ignored(path, f"a cached result this version cannot read as a {result_type.__name__}")


def _stage_json_result(blob: bytes) -> Any:
    """The result a record written with `StageJSON` holds, as plain data; else ValueError, KeyError or
    TypeError."""
    if len(blob) > RECORD_LIMIT:
        raise ValueError("larger than any stage record")
    record = json.loads(blob.decode("utf-8"))
    if record["metadata"]["serializer"] != {"type": StageJSON().type}:
        raise ValueError("not written with StageJSON")
    return json.loads(record["result"])


def _ignored(path: Path, reason: str) -> None:
    log.warning("warning: %s: %s; ignored, the stage runs again", path, reason)


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
    def figures(self) -> dict[str, Figure]:
        return self.result.figures if self.result is not None else {}

    @property
    def outputs(self) -> list[str]:
        return self.result.outputs if self.result is not None else []


def run_cached(name: str, stage_task: Any, result_type: type[R], /, **arguments: Any) -> StageOutcome:
    """A stage through its cache: the result its record holds (read and checked once) while its outputs
    are unchanged, else the stage run again, whose record replaces it."""
    started = time.perf_counter()
    key = stage_task.cache_key_fn(None, arguments)
    cached = read_record(Path(stage_task.result_storage) / key, result_type)
    stale = cached.stale_outputs() if cached is not None else []
    if cached is not None and not stale:
        shown_cached.with_options(name=name)(key)
        return StageOutcome(name, "cached", cached, _since(started))
    state = stage_task(**arguments, return_state=True)
    result = result_type.model_validate(state.result())
    return StageOutcome(name, "completed", result, _since(started), reran_because=stale)


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 3)
