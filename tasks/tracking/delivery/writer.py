"""The one way records reach the MLflow store: `RunWriter`, a thread that makes every call, through outages.

Callers never wait on the store for long. Every write (a run's creation, params, tags, metrics, inputs,
artifacts, a logged model, a run's end) becomes a plain record (`tasks.tracking.delivery.operations`)
queued in
order and returns at once; a caller that needs an answer (a new run's id, a read) waits at most
`answer_seconds`. On the writer's thread each record is sent in order, metrics batched, failed calls
retried with backoff.

A call that fails because the store is away (a refused connection, a timeout, a 5xx) starts an outage:
nothing is dropped. Records wait in memory, at most `memory_records` of them; beyond that the oldest go
to an outbox file (`tasks.tracking.delivery.outbox`). Every `probe_seconds` the oldest record is tried
again, and
when the store answers the outbox and then memory are delivered in order, with their original steps and
timestamps. A run created during an outage gets a `pending-...` key that its records carry until the
store creates it. If the store is still away at `close`, every waiting record is left in the outbox,
and `RunWriter.replay` (`gptpipe tracking replay FILE`) sends them later. A call the store refuses (a
4xx) is retried by nobody: it is counted and given up. The counts are the writer's `report`.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field
from itertools import chain, islice
from pathlib import Path
from typing import Any

from tasks.tracking.delivery.operations import (
    METRICS_PER_CALL,
    OPERATIONS,
    PARAM_VALUE_LIMIT,
    PENDING,
    TAG_VALUE_LIMIT,
    NotAModel,
    NotSendable,
    dataset_inputs,
    dumps,
    is_outage,
    metric,
    reason,
    text,
)
from tasks.tracking.delivery.outbox import Outbox
from tasks.tracking.store import redact

OUTBOX_DIRECTORY = Path("mlruns") / "outbox"  # relative to the working directory, like the local store
MEMORY_RECORDS = 10_000  # records held in memory during an outage before the oldest go to the outbox


@dataclass
class WriterReport:
    """What happened to the writer's records (the names are the `tracking.*` tags of a run)."""

    failed_calls: int = 0  # attempts that raised (each retried while retries last)
    given_up_calls: int = 0  # records the store refused (4xx) or that cannot be sent (a file gone)
    sent_metrics: int = 0
    dropped_metrics: int = 0  # metric values given up (refused, or the outbox could not be written)
    outages: int = 0  # times the store went away
    delivered_late: int = 0  # records sent after waiting out an outage
    skipped_records: int = 0  # records that are not the store's to take (a checkpoint without tokenizer)
    spilled_records: int = 0  # records written to the outbox to keep memory bounded
    waiting_records: int = 0  # records left in `outbox` at close (the store never came back)
    outbox: str = ""
    store_down: bool = False  # the store was away when the writer closed
    last_error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def warning(self, what: str) -> str | None:
        """The one line to print at the end about `what` (a run) when anything went wrong."""
        if self.waiting_records:
            return (
                f"warning: {what}: the tracking store is away ({self.last_error}); {self.waiting_records} "
                f"records wait in {self.outbox}: send them with `gptpipe tracking replay {self.outbox}` "
                "once it is back"
            )
        if self.failed_calls or self.given_up_calls:
            return (
                f"warning: {what}: {self.failed_calls} logging calls failed and were retried, "
                f"{self.given_up_calls} given up ({self.dropped_metrics} metric values lost); "
                f"last error: {self.last_error}"
            )
        return None


@dataclass
class _Item:
    """A queued record (`record`, plain), or a read (`call`) that is never spilled nor replayed."""

    record: dict[str, Any] | None = None
    call: Callable[[], Any] | None = None
    what: str = ""
    answer: Future | None = None
    queued: float = field(default_factory=time.monotonic)
    waited: bool = False  # it waited out an outage (counted as delivered late when sent)

    @property
    def op(self) -> str:
        return self.record["op"] if self.record is not None else self.what

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(error) if error is not None else self.answer.set_result(result)


class RunWriter:
    """Every call into one tracking store, made in order on one background thread, through outages."""

    def __init__(
        self,
        client: Any,
        *,
        retries: int = 3,
        backoff_seconds: float = 0.5,
        flush_seconds: float = 1.0,
        answer_seconds: float = 30.0,
        close_seconds: float = 60.0,
        probe_seconds: float = 5.0,
        memory_records: int = MEMORY_RECORDS,
        outbox: Outbox | Path | None = None,
        name: str = "mlflow-writer",
    ) -> None:
        self.client = client
        self.retries = retries
        self.backoff_seconds = backoff_seconds
        self.flush_seconds = flush_seconds
        self.answer_seconds = answer_seconds
        self.close_seconds = close_seconds
        self.probe_seconds = probe_seconds
        self.memory_records = max(2, memory_records)
        self.report = WriterReport()
        self._outbox = (
            outbox if isinstance(outbox, Outbox) else Outbox(_outbox_path(outbox, name), _uri(client))
        )
        self._ready = threading.Condition()
        self._memory: deque[_Item] = deque()  # newer than anything in the outbox
        self._inflight: list[_Item] = []  # the group being sent; first again after a failure
        self._inflight_end: int | None = None  # where it ends in the outbox, when read from there
        self._ids: dict[str, str] = {}  # pending key -> the run id the store gave it
        self._created: list[Callable[[str, str], None]] = []
        self._outage_since: float | None = None
        self._retry_at = 0.0
        self._closing = False
        self._last_try = False
        self._abandoned = False
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)  # may hang in a call
        self._thread.start()

    @classmethod
    def replay(cls, client: Any, outbox: Outbox, **options: Any) -> WriterReport:
        """Send an outbox's records in order; what the store does not take is left in the file."""
        options.setdefault("close_seconds", 3600.0)
        return cls(client, outbox=outbox, **options).close()

    # --- queued: return at once ------------------------------------------------------------------------

    def log_metrics(self, run: str, metrics: dict[str, float], step: int) -> None:
        stamp = int(time.time() * 1000)  # the original time, kept through an outage
        for key, value in metrics.items():
            self._put(metric(run, key, value, stamp, step))

    def log_params(self, run: str, values: dict[str, Any], keep_existing: bool = False) -> None:
        """Params as redacted, truncated text; with `keep_existing` (a resumed run) the ones the run
        already has are left alone, since MLflow refuses to change a param."""
        params = {k: text(v, PARAM_VALUE_LIMIT) for k, v in values.items()}
        self._put({"op": "log_params", "run": run, "params": params, "keep_existing": keep_existing})

    def set_tags(self, run: str, tags: dict[str, Any]) -> None:
        """Tags as redacted, truncated text; None values left out."""
        clean = {k: text(v, TAG_VALUE_LIMIT) for k, v in tags.items() if v is not None}
        if clean:
            self._put({"op": "set_tags", "run": run, "tags": clean})

    def log_inputs(self, run: str, datasets: list[Any]) -> None:
        """Dataset inputs (`mlflow.entities.DatasetInput`) of the run."""
        if datasets:
            self._put({"op": "log_inputs", "run": run, "datasets": dataset_inputs(datasets)})

    def log_artifact(self, run: str, path: Path, folder: str) -> None:
        if Path(path).is_file():
            self._put(
                {
                    "op": "log_artifact",
                    "run": run,
                    "path": str(Path(path).resolve()),
                    "folder": folder,
                }
            )

    def log_dict(self, run: str, data: dict[str, Any], file: str) -> None:
        plain = json.loads(json.dumps(data, default=str))
        self._put({"op": "log_dict", "run": run, "data": plain, "file": file})

    def log_text(self, run: str, text: str, file: str) -> None:
        self._put({"op": "log_text", "run": run, "text": redact(text), "file": file})

    def update_run(self, run: str, status: str) -> None:
        self._put({"op": "update_run", "run": run, "status": status})

    def set_terminated(self, run: str, status: str) -> None:
        self._put(
            {
                "op": "set_terminated",
                "run": run,
                "status": status,
                "end_time": int(time.time() * 1000),
            }
        )

    # --- answered: a bounded wait ------------------------------------------------------------------------

    def create_run(self, experiment_id: str, run_name: str, tags: dict[str, Any]) -> str | None:
        """The new run's id; during an outage (or no answer within `answer_seconds`) a `pending-...`
        key that later records may use and that becomes the id once the store creates the run; None
        when the store refused it."""
        key = f"{PENDING}{uuid.uuid4().hex}"
        clean = {k: text(v, TAG_VALUE_LIMIT) for k, v in tags.items() if v is not None}
        record = {
            "op": "create_run",
            "run": key,
            "experiment_id": experiment_id,
            "run_name": run_name,
            "tags": clean,
            "start_time": int(time.time() * 1000),
        }
        try:
            run_id = self._await(self._put(record, answered=True))
        except Exception:  # refused: counted on the writer's thread
            return None
        return run_id or key

    def log_model(
        self, run: str, experiment_id: str, path: Path, kind: str, tags: dict[str, str]
    ) -> str | None:
        """Log a checkpoint as a model of the run: its model id, or None when it waits for the store."""
        record = {"op": "log_model", "run": run, "experiment_id": experiment_id}
        record |= {"path": str(Path(path).resolve()), "kind": kind, "tags": tags}
        try:
            return self._await(self._put(record, answered=True))
        except Exception:
            return None

    def ask(self, what: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`function(*args, **kwargs)` on the writer's thread, after everything queued before it: its
        result, or None when it failed, the store is away, or no answer came within `answer_seconds`.
        A read is never spilled nor replayed."""
        with self._ready:
            if self._closed or self._outage_since is not None:
                return None
            item = _Item(call=lambda: function(*args, **kwargs), what=what, answer=Future())
            self._memory.append(item)
            self._ready.notify_all()
        try:
            return self._await(item)
        except Exception:  # counted on the writer's thread
            return None

    def resolved(self, run: str | None) -> str | None:
        """The store's id of `run` (an id, or a pending key once the store created its run)."""
        if run is None or not run.startswith(PENDING):
            return run
        return self._ids.get(run)

    def on_created(self, hook: Callable[[str, str], None]) -> None:
        """Call `hook(key, run_id)` on the writer's thread when a pending run is created."""
        self._created.append(hook)

    def note(self, error: str) -> None:
        """Record a problem found outside the store's calls (it shows in the report's `last_error`)."""
        with self._ready:
            self._count(last_error=error)

    def flush(self) -> bool:
        """Wait (bounded) until everything queued so far is sent; False when the store is away."""
        return self.ask("flush", lambda: True) is True

    def close(self) -> WriterReport:
        """Send what waits, for at most `close_seconds`; what the store did not take by then (away, or
        too slow) is left in the outbox, named in the report."""
        with self._ready:
            if self._closed:
                return self.report
            self._closed = self._closing = True
            self._ready.notify_all()
        away = self._outage_since is not None  # one last try, bounded like any answer
        bound = min(self.answer_seconds, self.close_seconds) if away else self.close_seconds
        self._thread.join(bound)
        if self._thread.is_alive():  # stuck in a call to a store that does not answer
            with self._ready:
                self._abandoned = True
                self._count(last_error=f"closing: the tracking store did not answer within {bound:g} s")
                self._leave_in_outbox()
        return self.report

    # --- the callers' side ------------------------------------------------------------------------------

    def _put(self, record: dict[str, Any], answered: bool = False) -> _Item | None:
        item = _Item(record=record, answer=Future() if answered else None)
        with self._ready:
            if self._outage_since is not None:  # its caller goes on; the record waits its turn
                item.waited = True
                item.settle(None)
            if self._closed:
                self._count(last_error=f"{record['op']}: the writer was closed", **_lost(item))
                return None
            self._memory.append(item)
            if len(self._memory) > self.memory_records:
                self._spill(len(self._memory) - self.memory_records // 2)
            self._ready.notify_all()
        return item

    def _await(self, item: _Item | None) -> Any:
        if item is None or item.answer is None:
            return None
        try:
            return item.answer.result(timeout=self.answer_seconds)
        except FutureTimeout:
            with self._ready:  # later asks return at once instead of waiting out the same store
                self._begin_outage(
                    f"{item.op}: the tracking store did not answer within {self.answer_seconds:g} s"
                )
            return None

    def _spill(self, count: int) -> None:
        """Move the `count` oldest records in memory to the outbox (lock held); reads are answered None."""
        oldest = [self._memory.popleft() for _ in range(count)]
        records = [item.record for item in oldest if item.record is not None]
        for item in oldest:
            item.settle(None)
        try:
            self.report.spilled_records += self._outbox.append(dumps(self._named(r)) for r in records)
        except OSError as error:  # the memory bound wins over the records: counted, not silent
            lost = sum(1 for r in records if r["op"] == "metric")
            self._count(
                dropped_metrics=lost,
                given_up_calls=len(records) - lost,
                last_error=f"{self._outbox.path}: cannot spill tracking records ({error})",
            )

    # --- the writer's thread ------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._ready:
                group = self._next_group()
                if group is None:
                    if not self._abandoned:
                        self._leave_in_outbox()
                    return
            self._deliver(group)

    def _next_group(self) -> list[_Item] | None:
        """The next records to send (lock held), waiting until they are due; None when done."""
        while not self._abandoned:
            now = time.monotonic()
            if self._outage_since is not None:
                if self._closing and self._last_try:
                    return None  # tried once more at close: the rest waits in the outbox
                if not self._closing and now < self._retry_at:
                    self._ready.wait(self._retry_at - now)
                    continue
            group, wait = self._head(now)
            if not group:
                if self._closing:
                    return None
                self._ready.wait()
            elif wait > 0 and not self._closing:
                self._ready.wait(wait)
            else:
                self._last_try = self._closing and self._outage_since is not None
                if not self._inflight:  # taken from memory now
                    for _ in group:
                        self._memory.popleft()
                    self._inflight, self._inflight_end = group, None
                return group
        return None

    def _head(self, now: float) -> tuple[list[_Item], float]:
        """The oldest group: the one in flight, else from the outbox, else from memory, with how long it
        may still wait (metrics wait up to `flush_seconds` to share a call)."""
        if self._inflight:
            return self._inflight, 0.0
        lines = self._outbox.read(METRICS_PER_CALL) if self._outbox.waiting else []
        if lines:
            group = _same_call([_Item(record=record, waited=True) for record, _ in lines])
            self._inflight, self._inflight_end = group, lines[len(group) - 1][1]
            return group, 0.0
        while self._memory and self._memory[0].record is None and self._memory[0].answer.done():
            self._memory.popleft()  # a read whose caller stopped waiting
        group = _same_call(list(islice(self._memory, METRICS_PER_CALL)))
        if (
            not group
            or group[0].op != "metric"
            or len(group) == METRICS_PER_CALL
            or len(group) < len(self._memory)
        ):
            return group, 0.0
        return group, group[0].queued + self.flush_seconds - now

    def _deliver(self, group: list[_Item]) -> None:
        attempts = 1 if self._outage_since is not None else self.retries + 1
        for attempt in range(attempts):
            try:
                result = self._send(group)
            except Exception as error:  # the store may fail in any way; the caller must not
                with self._ready:
                    if self._abandoned:
                        return
                    self._count(failed_calls=1, last_error=f"{group[0].op}: {redact(reason(error))}")
                    if isinstance(error, NotAModel):  # noted, not counted: the checkpoint's business
                        self._count(failed_calls=-1, skipped_records=1)
                        self._done(group, error=error, counted=False)
                        return
                    if not is_outage(error):
                        self._done(group, error=error)
                        return
                    group[0].settle(None)  # its caller goes on now; the record stays first in line
                if attempt + 1 < attempts:
                    time.sleep(self.backoff_seconds * 2**attempt)
                    continue
                with self._ready:
                    self._begin_outage(self.report.last_error)
                    self._retry_at = time.monotonic() + self.probe_seconds
                return
            with self._ready:
                if not self._abandoned:
                    self._done(group, result=result)
                hooks = list(self._created) if group[0].op == "create_run" and result else []
            for hook in hooks:
                hook(group[0].record["run"], result)
            return

    def _send(self, group: list[_Item]) -> Any:
        first = group[0]
        if first.call is not None:
            return first.call()
        run = self.resolved(first.record["run"]) if first.op != "create_run" else first.record["run"]
        if run is None:
            raise NotSendable(f"{first.op}: its run {first.record['run']} was never created")
        if first.op == "metric":
            return OPERATIONS["metric"](self.client, run, [item.record for item in group])
        return OPERATIONS[first.op](self.client, run, first.record)

    def _done(
        self, group: list[_Item], result: Any = None, error: BaseException | None = None, counted: bool = True
    ) -> None:
        """`group` left the queue (lock held): sent, or given up (`counted` among the given-up calls)."""
        if error is None:
            self._outage_since = None  # the store answers
            self.report.delivered_late += sum(item.waited for item in group)
        if error is None and group[0].op == "create_run":
            self._ids[group[0].record["run"]] = result
        if group[0].op == "metric":
            self._count(
                **({"sent_metrics": len(group)} if error is None else {"dropped_metrics": len(group)})
            )
        elif error is not None and counted:
            self._count(given_up_calls=1)
        group[0].settle(result, error)
        if self._inflight_end is not None:
            self._outbox.delivered(self._inflight_end, len(group))
        self._inflight, self._inflight_end = [], None

    def _begin_outage(self, reason: str) -> None:
        """The store is away (lock held): callers waiting for answers get None now, not minutes later."""
        self.report.last_error = reason
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            self.report.outages += 1
        for item in [*self._inflight, *self._memory]:
            item.settle(None)
            item.waited = True

    def _leave_in_outbox(self) -> None:
        """At the end (lock held): every record not delivered goes to the outbox, in order."""
        from_memory = self._inflight if self._inflight_end is None else []  # else still in the outbox
        head = [item.record for item in from_memory if item.record is not None]
        tail = [item.record for item in self._memory if item.record is not None]
        for item in (*self._inflight, *self._memory):
            item.settle(None)
        self._inflight, self._memory = [], deque()
        if not head and not tail and not self._outbox.waiting:
            return
        records = (self._named(record) for record in chain(head, self._outbox.remaining(), tail))
        try:
            self.report.waiting_records = self._outbox.rewrite(records)
        except OSError as error:
            self._count(last_error=f"{self._outbox.path}: cannot keep the tracking records ({error})")
            return
        self.report.outbox = str(self._outbox.path)
        self.report.store_down = self._outage_since is not None or self._abandoned

    def _named(self, record: dict[str, Any]) -> dict[str, Any]:
        """`record` with its run's pending key replaced by the id, once the store gave one."""
        run = record.get("run", "")
        if record["op"] != "create_run" and run in self._ids:
            return {**record, "run": self._ids[run]}
        return record

    def _count(self, last_error: str | None = None, **increments: int) -> None:
        for name, amount in increments.items():
            setattr(self.report, name, getattr(self.report, name) + amount)
        if last_error is not None:
            self.report.last_error = last_error


def _same_call(items: list[_Item]) -> list[_Item]:
    """The leading items that go in one call: consecutive metrics of one run, else the first alone."""
    if not items:
        return []
    first = items[0]
    if first.op != "metric":
        return [first]
    group = [first]
    for item in items[1:]:
        if item.op != "metric" or item.record["run"] != first.record["run"]:
            break
        group.append(item)
    return group


def _lost(item: _Item) -> dict[str, int]:
    return {"dropped_metrics": 1} if item.op == "metric" else {"given_up_calls": 1}


def _uri(client: Any) -> str:
    return redact(getattr(client, "tracking_uri", "") or "")


def _outbox_path(folder: Path | None, name: str) -> Path:
    """A fresh outbox file for this writer: `<folder>/<name>-<time>-<pid>.jsonl`."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (Path(folder or OUTBOX_DIRECTORY).resolve()) / f"{safe}-{stamp}-{os.getpid()}.jsonl"
