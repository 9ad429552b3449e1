"""The one way records reach the MLflow store: `RunWriter`, a thread that makes every call, through outages.

Callers never wait on the store for long. Every write (a run's creation, params, tags, metrics, inputs,
artifacts, a logged model, a run's end) becomes a typed record (`tasks.tracking.delivery.records`)
queued in order and returns at once; a caller that needs an answer (a new run's id, a read) waits at
most `answer_seconds`. The delivery loop (`tasks.tracking.delivery.loop`) sends the records in order,
retries, waits out outages with the records in memory and then in the outbox, and leaves what the store
never took in the outbox for `RunWriter.replay` (`gptpipe tracking replay FILE`). A run created during
an outage gets a `pending-...` key that its records carry until the store creates it. The counts are
the writer's `report`.

Why not MLflow's own asynchronous logging (`log_batch(..., synchronous=False)`)? It queues metrics,
params and tags only (not runs, inputs, artifacts nor models, whose calls would still block the training
thread); its queue is unbounded in memory; and a batch that fails is dropped with a log line, so an
outage loses what was logged during it, where this writer keeps every record and says where it waits.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.tracking.delivery import records
from tasks.tracking.delivery.loop import MEMORY_RECORDS, DeliveryLoop, DeliverySettings
from tasks.tracking.delivery.operations import (
    PARAM_VALUE_LIMIT,
    PENDING,
    RECORD_KEY,
    TAG_VALUE_LIMIT,
    dataset_inputs,
    metric,
    text,
)
from tasks.tracking.delivery.outbox import Outbox
from tasks.tracking.delivery.queue import Item
from tasks.tracking.delivery.report import WriterReport
from tasks.tracking.store import redact, redact_data

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import DatasetInput

OUTBOX_DIRECTORY = Path("mlruns") / "outbox"  # relative to the working directory, like the local store

__all__ = ["MEMORY_RECORDS", "OUTBOX_DIRECTORY", "DeliverySettings", "RunWriter", "WriterReport"]


class RunWriter:
    """Every call into one tracking store, made in order on one background thread, through outages."""

    def __init__(
        self,
        client: MlflowClient,
        *,
        delivery: DeliverySettings = DeliverySettings(),
        outbox: Outbox | Path | None = None,
        name: str = "mlflow-writer",
    ) -> None:
        self.client = client
        self.answer_seconds = delivery.answer_seconds  # the longest a caller waits for an answer
        self.report = WriterReport()
        if not isinstance(outbox, Outbox):
            outbox = Outbox(_outbox_path(outbox, name), _uri(client))
        self._loop = DeliveryLoop(client, self.report, outbox, delivery, name)

    @classmethod
    def replay(cls, client: MlflowClient, outbox: Outbox) -> WriterReport:
        """Send an outbox's records in order, each once; what the store does not take is left in the file
        (`tasks.tracking.delivery.replay`)."""
        from tasks.tracking.delivery.replay import replay

        return replay(client, outbox)

    # --- queued: return at once ------------------------------------------------------------------------

    def log_metrics(self, run: str, metrics: dict[str, float], step: int) -> None:
        stamp = int(time.time() * 1000)  # the original time, kept through an outage
        for key, value in metrics.items():
            self._put(metric(run, key, value, stamp, step))

    def log_params(self, run: str, values: Mapping[str, object], keep_existing: bool = False) -> None:
        """Params (any value: MLflow keeps its text) as redacted, truncated text; with `keep_existing` (a
        resumed run) the ones the run already has are left alone, since MLflow refuses to change one."""
        params = {k: text(v, PARAM_VALUE_LIMIT) for k, v in values.items()}
        self._put(records.LogParams(run=run, params=params, keep_existing=keep_existing))

    def set_tags(self, run: str, tags: Mapping[str, object]) -> None:
        """Tags as redacted, truncated text; None values left out."""
        clean = _tag_texts(tags)
        if clean:
            self._put(records.SetTags(run=run, tags=clean))

    def log_inputs(self, run: str, datasets: Sequence[DatasetInput]) -> None:
        """Dataset inputs of the run."""
        if datasets:
            self._put(records.LogInputs(run=run, datasets=dataset_inputs(datasets)))

    def log_artifact(self, run: str, path: Path, folder: str) -> None:
        if Path(path).is_file():
            self._put(records.LogArtifact(run=run, path=str(Path(path).resolve()), folder=folder))

    def log_dict(self, run: str, data: Mapping[str, object], file: str) -> None:
        """`data` as the JSON file `file` of the run (values JSON lacks as their text), redacted."""
        plain = redact_data(json.loads(json.dumps(data, default=str)))
        self._put(records.LogDict(run=run, data=plain, file=file))

    def log_text(self, run: str, text: str, file: str) -> None:
        self._put(records.LogText(run=run, text=redact(text), file=file))

    def update_run(self, run: str, status: str) -> None:
        self._put(records.UpdateRun(run=run, status=status))

    def set_terminated(self, run: str, status: str) -> None:
        self._put(records.SetTerminated(run=run, status=status, end_time=int(time.time() * 1000)))

    # --- answered: a bounded wait ------------------------------------------------------------------------

    def create_run(self, experiment_id: str, run_name: str, tags: Mapping[str, object]) -> str | None:
        """The new run's id; during an outage (or no answer within `answer_seconds`) a `pending-...`
        key that later records may use and that becomes the id once the store creates the run; None
        when the store refused it."""
        key = f"{PENDING}{uuid.uuid4().hex}"
        clean = _tag_texts(tags)
        clean[RECORD_KEY] = key  # a replay after a kill finds the run by it instead of making another
        record = records.CreateRun(
            run=key,
            experiment_id=experiment_id,
            run_name=run_name,
            tags=clean,
            start_time=int(time.time() * 1000),
        )
        try:
            run_id = self._await(self._put(record, answered=True))
        except Exception:  # refused: counted on the writer's thread
            return None
        return run_id or key

    def log_model(
        self, run: str, experiment_id: str, path: Path, kind: str, tags: dict[str, str]
    ) -> str | None:
        """Log a checkpoint as a model of the run: its model id, or None when it waits for the store."""
        where = str(Path(path).resolve())
        record = records.LogModel(run=run, experiment_id=experiment_id, path=where, kind=kind, tags=tags)
        try:
            return self._await(self._put(record, answered=True))
        except Exception:
            return None

    def ask(self, what: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`function(*args, **kwargs)` on the writer's thread, after everything queued before it: its
        result, or None when it failed, the store is away, or no answer came within `answer_seconds`.
        A read is never spilled nor replayed."""
        try:
            return self._await(self._loop.ask(what, lambda: function(*args, **kwargs)))
        except Exception:  # counted on the writer's thread
            return None

    def resolved(self, run: str | None) -> str | None:
        """The store's id of `run` (an id, or a pending key once the store created its run)."""
        return self._loop.resolved(run)

    def on_created(self, hook: Callable[[str, str], None]) -> None:
        """Call `hook(key, run_id)` on the writer's thread when a pending run is created."""
        self._loop.on_created(hook)

    def note(self, error: str) -> None:
        """Record a problem found outside the store's calls (it shows in the report's `last_error`)."""
        self._loop.note(error)

    def flush(self) -> bool:
        """Wait (bounded) until everything queued so far is sent; False when the store is away."""
        return self.ask("flush", lambda: True) is True

    def close(self) -> WriterReport:
        """Send what waits, for at most `close_seconds`; what the store did not take by then (away, or
        too slow) is left in the outbox, named in the report."""
        self._loop.close()
        return self.report

    def _put(self, record: records.Record, answered: bool = False) -> Item | None:
        return self._loop.put(record, answered)

    def _await(self, item: Item | None) -> Any:
        return self._loop.answer(item)


def _tag_texts(tags: Mapping[str, object]) -> dict[str, str]:
    """Tags as MLflow keeps them: redacted text within its length; None values left out."""
    return {k: text(v, TAG_VALUE_LIMIT) for k, v in tags.items() if v is not None}


def _uri(client: MlflowClient) -> str:
    return redact(getattr(client, "tracking_uri", "") or "")


def _outbox_path(folder: Path | None, name: str) -> Path:
    """A fresh outbox file for this writer: `<folder>/<name>-<time>-<pid>.jsonl`."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (Path(folder or OUTBOX_DIRECTORY).resolve()) / f"{safe}-{stamp}-{os.getpid()}.jsonl"
