"""What a pipeline stage is: one object, in one module of `tasks/stages/`, that says what it needs, what
keys its cache, what it computes, what it returns and how it is recorded.

A stage's fields are its inputs: the parameter file, the results of the stages before it and the typed
values they resolved (the start model, the checkpoint it reads). Its class says the rest:

- `key()`: what decides its output besides code (upstream fingerprints, the settings it reads);
- `compute(fingerprint)`: the work, run as a Prefect task named for the stage;
- `result_type`: its typed result (a `tasks.results.StageResult`);
- `record(outcome, tracking)`: what MLflow keeps of it (its stage run, by default);
- `skip_reason()`: why the parameter file turns it off (None: it runs).

Its cache key is `key()` with the code version of every module its own module reaches by its imports
(`code_reached`): a gptcore module the stage starts to call is in its key without anyone listing it. The
flows compose stage objects (`Tokens(params=..., tokenizer=...).run(tracking)`); adding a stage is one new
module here and the line of the flow that places it.
"""

from __future__ import annotations

import ast
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from gptcore.tools.fingerprint import fingerprint, sources_digest
from tasks.caching import StageOutcome, records_folder, run_cached, stage_task
from tasks.params.schema import PipelineParams
from tasks.results import StageResult

if TYPE_CHECKING:
    from tasks.tracking import PipelineRecorder

R = TypeVar("R", bound=StageResult)
ROOT = Path(__file__).resolve().parents[1]
# What a stage's key follows imports through: the engine and the stages. The MLflow side and the progress
# shown to people record or show outputs, never decide them; the parameter schema is keyed by value (each
# stage keys on the sections it reads), so a new field's docstring does not retrain a model.
FOLLOWED = ("gptcore", "tasks")
NOT_FOLLOWED = ("tasks.tracking", "tasks.params.schema", "tasks.prefect_progress", "tasks.progress_bar")


def announce(message: str) -> None:
    """A line for the person at the terminal (stderr: stdout ends with the JSON record)."""
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True, kw_only=True)
class Stage(Generic[R]):
    """One stage of a flow over `params`; subclasses add the inputs they need as fields."""

    result_type: ClassVar[type[StageResult]]
    cached: ClassVar[bool] = True  # False: it runs every time (the device check, the start model)

    name: str  # the stage's name in the report, MLflow and Prefect (a class's default; a flow may rename)
    params: PipelineParams

    def key(self) -> tuple[Any, ...]:
        """What decides the output besides code: upstream fingerprints and the settings read."""
        raise NotImplementedError

    def compute(self, fingerprint: str | None) -> R:
        """The stage's work (in its Prefect task): its outputs written, its result returned."""
        raise NotImplementedError

    def skip_reason(self) -> str | None:
        """Why the parameter file (or the machine) turns the stage off; None: it runs."""
        return None

    def record(self, outcome: StageOutcome, tracking: PipelineRecorder) -> StageOutcome:
        """What MLflow keeps of the stage: its stage run with the result's figures and manifest."""
        tracking.record_stage(outcome)
        return outcome

    def fingerprint(self) -> str:
        return fingerprint(*self.key(), code_reached(type(self).__module__))

    def run(self, tracking: PipelineRecorder) -> StageOutcome:
        """The stage skipped, taken from its cache, or computed; recorded either way."""
        reason = self.skip_reason()
        if reason is not None:
            announce(f"{self.name}: skipped: {reason}")
            outcome = StageOutcome(self.name, "skipped", message=reason)
        elif self.cached:
            task_ = prefect_task(self.name, records_folder())  # read now: a process may run several flows
            outcome = run_cached(
                self.name, task_, self.result_type, fingerprint=self.fingerprint(), stage=self
            )
        else:
            started = time.perf_counter()
            result = prefect_task(self.name, None)(fingerprint=None, stage=self)
            outcome = StageOutcome(self.name, "completed", result, round(time.perf_counter() - started, 3))
        return self.record(outcome, tracking)


def _compute(fingerprint: str | None, stage: Stage[Any]) -> StageResult:
    return stage.compute(fingerprint)


@cache
def prefect_task(name: str, records: Path | None) -> Task[..., StageResult]:
    """The Prefect task a stage runs in, named for it: a cached stage's result recorded under its
    fingerprint in `records` (`tasks.caching.stage_task`), an uncached one's (`records` None) not kept."""
    if records is not None:
        return stage_task(name, records)(_compute)
    return task(name=name, cache_policy=NO_CACHE, persist_result=False)(_compute)


def code_reached(module: str) -> str:
    """The code version of `module` and every module of gptcore and tasks it reaches by its imports
    (`FOLLOWED`, without `NOT_FOLLOWED`), each hashed by name and source."""
    return sources_digest((name, _source(name)) for name in sorted(_reached(module)))


@cache
def _reached(module: str) -> frozenset[str]:
    seen, waiting = set(), [module]
    while waiting:
        name = waiting.pop()
        if name in seen:
            continue
        seen.add(name)
        waiting.extend(found for found in _imports(name) if found not in seen)
    return frozenset(seen)


@cache
def _imports(module: str) -> tuple[str, ...]:
    """The followed modules `module`'s source imports anywhere in it (a function's lazy import too)."""
    tree = ast.parse(_source(module).read_text(encoding="utf-8"))
    named: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            named += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return tuple(name for name in dict.fromkeys(named) if _followed(name) and _module_file(name))


def _followed(name: str) -> bool:
    def within(room: str) -> bool:
        return name == room or name.startswith(room + ".")

    return any(within(room) for room in FOLLOWED) and not any(within(room) for room in NOT_FOLLOWED)


@cache
def _module_file(name: str) -> Path | None:
    """The source file of a module of this checkout (None: a name that is a class or function)."""
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _source(name: str) -> Path:
    path = _module_file(name)
    if path is None:
        raise ModuleNotFoundError(f"{name}: no source file under {ROOT}")
    return path
