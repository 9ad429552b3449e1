"""The one way records reach the MLflow store: `RunWriter`, a thread that makes every call.

Callers never wait on the store for long. Writes (params, tags, metrics, artifacts, a run's end) are
queued and return at once; a call whose answer the caller needs (creating a run, reading one) waits at
most `answer_seconds`. On the writer's thread each call is redacted (secret values), truncated to
MLflow's limits, batched (params, tags and metrics in `log_batch` calls), retried with backoff, and
counted when it fails. A store that does not answer in time is declared down: the writer's thread may
be stuck in the HTTP client's own retries for minutes, so later calls are dropped and counted instead
of queuing behind it, and `close` gives up after a bounded wait. The counts are the writer's `report`.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gptcore.errors import first_line
from tasks.tracking.store import redact

PARAM_VALUE_LIMIT = 6000  # MLflow's limits on one value and on one log_batch call
TAG_VALUE_LIMIT = 8000
PARAMS_PER_CALL = 100
METRICS_PER_CALL = 1000
MAX_QUEUED = 100_000  # beyond this a store that cannot keep up loses values rather than memory


@dataclass
class WriterReport:
    """What happened to the writer's calls (the names are the `tracking.*` tags of a run)."""

    failed_calls: int = 0  # attempts that raised (each retried while retries last)
    given_up_calls: int = 0  # calls still failing after every retry, or dropped while the store was down
    sent_metrics: int = 0
    dropped_metrics: int = 0
    store_down: bool = False  # a call went unanswered for `answer_seconds`
    last_error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Call:
    what: str
    function: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    answer: Future | None = None


@dataclass
class _Metric:
    run_id: str
    metric: Any  # mlflow.entities.Metric


_STOP = object()


class RunWriter:
    """Every call into one tracking store, made in order on one background thread."""

    def __init__(
        self,
        client: Any,
        *,
        retries: int = 3,
        backoff_seconds: float = 0.5,
        flush_seconds: float = 1.0,
        answer_seconds: float = 30.0,
        close_seconds: float = 60.0,
        name: str = "mlflow-writer",
    ) -> None:
        self.client = client
        self.retries = retries
        self.backoff_seconds = backoff_seconds
        self.flush_seconds = flush_seconds
        self.answer_seconds = answer_seconds
        self.close_seconds = close_seconds
        self.report = WriterReport()
        self._lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)  # may hang in a call
        self._thread.start()

    # --- queued: return at once ------------------------------------------------------------------------

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        for key, value in metrics.items():
            if not self._put(_Metric(run_id, Metric(key, value, stamp, step))):
                self._count(dropped_metrics=1)

    def log_params(self, run_id: str, values: dict[str, Any], keep_existing: bool = False) -> None:
        """Params as redacted, truncated text; with `keep_existing` (a resumed run) the ones the run
        already has are left alone, since MLflow refuses to change a param."""
        self._submit("log_params", self._send_params, run_id, dict(values), keep_existing)

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        """Tags as redacted, truncated text; None values left out."""
        from mlflow.entities import RunTag

        batch = [RunTag(k, _text(v, TAG_VALUE_LIMIT)) for k, v in tags.items() if v is not None]
        if batch:
            self._submit("set_tags", self.client.log_batch, run_id, tags=batch)

    def log_inputs(self, run_id: str, datasets: list[Any]) -> None:
        """Dataset inputs (`mlflow.entities.DatasetInput`) of the run."""
        if datasets:
            self._submit("log_inputs", self.client.log_inputs, run_id, datasets=datasets)

    def log_artifact(self, run_id: str, path: Path, folder: str) -> None:
        if Path(path).is_file():
            self._submit("log_artifact", self.client.log_artifact, run_id, str(path), folder)

    def log_dict(self, run_id: str, data: dict[str, Any], file: str) -> None:
        plain = json.loads(json.dumps(data, default=str))
        self._submit("log_dict", self.client.log_dict, run_id, plain, file)

    def log_text(self, run_id: str, text: str, file: str) -> None:
        self._submit("log_text", self.client.log_text, run_id, redact(text), file)

    def set_terminated(self, run_id: str, status: str) -> None:
        self._submit("set_terminated", self.client.set_terminated, run_id, status)

    # --- answered: a bounded wait ------------------------------------------------------------------------

    def create_run(self, experiment_id: str, run_name: str, tags: dict[str, Any]) -> str | None:
        """A new run's id, or None when the store failed or did not answer within `answer_seconds`."""
        clean = {k: _text(v, TAG_VALUE_LIMIT) for k, v in tags.items() if v is not None}
        run = self.ask("create_run", self.client.create_run, experiment_id, run_name=run_name, tags=clean)
        return run.info.run_id if run is not None else None

    def ask(self, what: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`function(*args, **kwargs)` on the writer's thread, after everything queued before it: its
        result, or None when it failed every retry or went unanswered for `answer_seconds` (the store
        is then down)."""
        answer: Future = Future()
        if not self._put(_Call(what, function, args, kwargs, answer)):
            self._count(given_up_calls=1)
            return None
        try:
            return answer.result(timeout=self.answer_seconds)
        except FutureTimeout:
            self._down(f"{what}: the tracking store did not answer within {self.answer_seconds:g} s")
            return None
        except Exception:  # counted on the writer's thread
            return None

    def note(self, error: str) -> None:
        """Record a problem found outside the store's calls (it shows in the report's `last_error`)."""
        self._count(last_error=error)

    def flush(self) -> bool:
        """Wait (bounded) until everything queued so far is sent; False when the store is down."""
        return self.ask("flush", lambda: True) is True

    def close(self) -> WriterReport:
        """Send what is queued, waiting at most `close_seconds` (none when the store is down); stop."""
        with self._lock:
            if self._closed:
                return self.report
            self._closed = True
        self._queue.put(_STOP)
        if self.report.store_down:
            self._down(self.report.last_error)  # what still waits is given up now
            return self.report
        self._thread.join(self.close_seconds)
        if self._thread.is_alive():
            self._down(f"closing: calls still unsent after {self.close_seconds:g} s were given up")
        return self.report

    # --- the writer's thread ------------------------------------------------------------------------------

    def _put(self, item: Any) -> bool:
        if self._closed or self.report.store_down or self._queue.qsize() >= MAX_QUEUED:
            return False
        self._queue.put(item)
        return True

    def _submit(self, what: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        if self._put(_Call(what, function, args, kwargs)):
            return True
        self._count(given_up_calls=1)
        return False

    def _work(self) -> None:
        pending: list[_Metric] = []  # metrics wait at most flush_seconds, to go in few calls
        deadline = time.monotonic() + self.flush_seconds
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                item = None
            if isinstance(item, _Metric):
                pending.append(item)
                if len(pending) < METRICS_PER_CALL:
                    continue
            self._send_metrics(pending)  # before any other call, so records stay in order
            pending = []
            deadline = time.monotonic() + self.flush_seconds
            if isinstance(item, _Call):
                self._run(item)
            elif item is _STOP:
                return

    def _run(self, call: _Call) -> None:
        for attempt in range(self.retries + 1):
            try:
                result = call.function(*call.args, **call.kwargs)
            except Exception as error:  # the store may fail in any way; the caller must not
                reason = first_line(error)
                self._count(failed_calls=1, last_error=f"{call.what}: {redact(reason)}")
                if attempt < self.retries:
                    time.sleep(self.backoff_seconds * 2**attempt)
                    continue
                self._count(given_up_calls=1)
                if call.answer is not None:
                    call.answer.set_exception(error)
                return
            if call.answer is not None:
                call.answer.set_result(result)
            return

    def _send_metrics(self, pending: list[_Metric]) -> None:
        for run_id in dict.fromkeys(item.run_id for item in pending):
            batch = [item.metric for item in pending if item.run_id == run_id]
            answer: Future = Future()
            self._run(_Call("log_metrics", self.client.log_batch, (run_id,), {"metrics": batch}, answer))
            if answer.exception() is None:
                self._count(sent_metrics=len(batch))
            else:
                self._count(dropped_metrics=len(batch))

    def _send_params(self, run_id: str, values: dict[str, Any], keep_existing: bool) -> None:
        from mlflow.entities import Param

        existing = self.client.get_run(run_id).data.params if keep_existing else {}
        fresh = [Param(k, _text(v, PARAM_VALUE_LIMIT)) for k, v in values.items() if k not in existing]
        for start in range(0, len(fresh), PARAMS_PER_CALL):
            self.client.log_batch(run_id, params=fresh[start : start + PARAMS_PER_CALL])

    def _count(self, last_error: str | None = None, **increments: int) -> None:
        with self._lock:
            for name, amount in increments.items():
                setattr(self.report, name, getattr(self.report, name) + amount)
            if last_error is not None:
                self.report.last_error = last_error

    def _down(self, reason: str) -> None:
        with self._lock:
            self.report.store_down = True
            self.report.last_error = reason
        while True:  # what waits behind the unanswered call is given up now, not sent minutes later
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                self._queue.put(_STOP)
                break
            if isinstance(item, _Metric):
                self._count(dropped_metrics=1)
            else:
                self._count(given_up_calls=1)


def _text(value: Any, limit: int) -> str:
    """A param or tag value as MLflow stores it: redacted text within its length limit."""
    return redact(value)[:limit]
