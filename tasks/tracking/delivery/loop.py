"""The writer's delivery loop: one thread that makes every call into the store, in order, through outages.

The thread takes the oldest group of records (`RecordQueue`: metrics of one run batched, waiting up to
`flush_seconds` to share a call) and sends it; a failed call is retried with backoff, the one retry layer
(MLflow's own HTTP retries are turned off, `store.HTTP_DEFAULTS`). A call that fails because the store
is away (a refused connection, a timeout, a 5xx) starts an outage: nothing is dropped, callers waiting
for an answer get None at once, and every `probe_seconds` the oldest record is tried again until the
store answers. A call the store refuses (a 4xx) is retried by nobody: it is counted and given up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tasks.tracking.delivery.operations import OPERATIONS, PENDING, NotAModel, NotSendable, is_outage, reason
from tasks.tracking.delivery.outbox import Outbox
from tasks.tracking.delivery.queue import Item, RecordQueue
from tasks.tracking.delivery.records import Record
from tasks.tracking.delivery.report import WriterReport
from tasks.tracking.store import redact

if TYPE_CHECKING:
    from mlflow import MlflowClient

MEMORY_RECORDS = 10_000  # records held in memory during an outage before the oldest go to the outbox


@dataclass(frozen=True)
class DeliverySettings:
    """How a writer's loop delivers: one object handed from whoever opens a writer (a training run's
    callback, a pipeline's recorder, a test) through `RunWriter` to its `DeliveryLoop`."""

    retries: int = 3  # more tries of a failed call, `backoff_seconds * 2**n` apart, before an outage
    backoff_seconds: float = 0.5
    flush_seconds: float = 1.0  # the longest a metric waits for others to share its call
    answer_seconds: float = 30.0  # the longest a caller waits for an answer
    close_seconds: float = 60.0  # the longest `close` sends what waits before leaving it in the outbox
    probe_seconds: float = 5.0  # how often a store that went away is tried again
    memory_records: int = MEMORY_RECORDS  # records held in memory during an outage, then the outbox


class DeliveryLoop:
    """The thread that delivers one store's queued records. Callers `put` records and `ask` for reads;
    `answer` waits for one at most `answer_seconds`; `close` sends what waits for at most
    `close_seconds` and leaves the rest in the outbox."""

    def __init__(
        self,
        client: MlflowClient,
        report: WriterReport,
        outbox: Outbox,
        settings: DeliverySettings,
        name: str,
    ) -> None:
        self.client, self.report, self.settings = client, report, settings
        self.queue = RecordQueue(outbox, report, settings.memory_records, settings.flush_seconds)
        self._ready = threading.Condition()  # guards the queue and the state below
        self._created: list[Callable[[str, str], None]] = []
        self._outage_since: float | None = None
        self._retry_at = 0.0
        self._closing = False
        self._last_try = False
        self._abandoned = False
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)  # may hang in a call
        self._thread.start()

    # --- the callers' side ------------------------------------------------------------------------------

    def put(self, record: Record, answered: bool = False) -> Item | None:
        """Queue `record`; with `answered`, its caller may wait for the result (`answer`)."""
        item = Item(record=record, answer=Future() if answered else None)
        with self._ready:
            if self._outage_since is not None:  # its caller goes on; the record waits its turn
                item.waited = True
                item.settle(None)
            if self._closed:
                lost = {"dropped_metrics": 1} if item.op == "metric" else {"given_up_calls": 1}
                self.report.count(last_error=f"{record.op}: the writer was closed", **lost)
                return None
            self.queue.append(item)
            self._ready.notify_all()
        return item

    def ask(self, what: str, call: Callable[[], Any]) -> Item | None:
        """Queue a read (`call` on the writer's thread, after everything queued before it); None when
        closed or the store is away (a read is never spilled nor replayed)."""
        with self._ready:
            if self._closed or self._outage_since is not None:
                return None
            item = Item(call=call, what=what, answer=Future())
            self.queue.memory.append(item)
            self._ready.notify_all()
        return item

    def answer(self, item: Item | None) -> Any:
        """The result of `item`, waiting at most `answer_seconds`: None without one (an outage begins)."""
        if item is None or item.answer is None:
            return None
        try:
            return item.answer.result(timeout=self.settings.answer_seconds)
        except FutureTimeout:
            with self._ready:  # later asks return at once instead of waiting out the same store
                self._begin_outage(
                    f"{item.op}: the tracking store did not answer within {self.settings.answer_seconds:g} s"
                )
            return None

    def resolved(self, run: str | None) -> str | None:
        """The store's id of `run` (an id, or a pending key once the store created its run)."""
        if run is None or not run.startswith(PENDING):
            return run
        return self.queue.ids.get(run)

    def on_created(self, hook: Callable[[str, str], None]) -> None:
        """Call `hook(key, run_id)` on the writer's thread when a pending run is created."""
        self._created.append(hook)

    def note(self, error: str) -> None:
        """Record a problem found outside the store's calls (it shows in the report's `last_error`)."""
        with self._ready:
            self.report.count(last_error=error)

    def close(self) -> None:
        """Send what waits, for at most `close_seconds`; what the store did not take by then (away, or
        too slow) is left in the outbox, named in the report."""
        with self._ready:
            if self._closed:
                return
            self._closed = self._closing = True
            self._ready.notify_all()
        away = self._outage_since is not None  # one last try, bounded like any answer
        answer, close = self.settings.answer_seconds, self.settings.close_seconds
        bound = min(answer, close) if away else close
        self._thread.join(bound)
        if self._thread.is_alive():  # stuck in a call to a store that does not answer
            with self._ready:
                self._abandoned = True
                self.report.count(last_error=f"closing: the tracking store did not answer within {bound:g} s")
                self.queue.leave_in_outbox(store_down=True)

    # --- the writer's thread ------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._ready:
                group = self._next_group()
                if group is None:
                    if not self._abandoned:
                        self.queue.leave_in_outbox(store_down=self._outage_since is not None)
                    return
            self._deliver(group)

    def _next_group(self) -> list[Item] | None:
        """The next records to send (lock held), waiting until they are due; None when done."""
        while not self._abandoned:
            now = time.monotonic()
            if self._outage_since is not None:
                if self._closing and self._last_try:
                    return None  # tried once more at close: the rest waits in the outbox
                if not self._closing and now < self._retry_at:
                    self._ready.wait(self._retry_at - now)
                    continue
            group, wait = self.queue.head(now)
            if not group:
                if self._closing:
                    return None
                self._ready.wait()
            elif wait > 0 and not self._closing:
                self._ready.wait(wait)
            else:
                self._last_try = self._closing and self._outage_since is not None
                self.queue.take(group)
                return group
        return None

    def _deliver(self, group: list[Item]) -> None:
        attempts = 1 if self._outage_since is not None else self.settings.retries + 1
        for attempt in range(attempts):
            try:
                result = self._send(group)
            except Exception as error:  # the store may fail in any way; the caller must not
                with self._ready:
                    if self._abandoned:
                        return
                    self.report.count(failed_calls=1, last_error=f"{group[0].op}: {redact(reason(error))}")
                    if isinstance(error, NotAModel):  # noted, not counted: the checkpoint's business
                        self.report.count(failed_calls=-1, skipped_records=1)
                        self._done(group, error=error, counted=False)
                        return
                    if not is_outage(error):
                        self._done(group, error=error)
                        return
                    group[0].settle(None)  # its caller goes on now; the record stays first in line
                if attempt + 1 < attempts:
                    time.sleep(self.settings.backoff_seconds * 2**attempt)
                    continue
                with self._ready:
                    self._begin_outage(self.report.last_error)
                    self._retry_at = time.monotonic() + self.settings.probe_seconds
                return
            with self._ready:
                if not self._abandoned:
                    self._done(group, result=result)
                hooks = list(self._created) if group[0].op == "create_run" and result else []
            for hook in hooks:
                hook(group[0].record.run, result)
            return

    def _send(self, group: list[Item]) -> Any:
        first = group[0]
        if first.call is not None:
            return first.call()
        key = first.record.run
        run = self.resolved(key) if first.op != "create_run" else key
        if run is None:
            raise NotSendable(f"{first.op}: its run {key} was never created")
        if first.op == "metric":
            return OPERATIONS["metric"](self.client, run, [item.record for item in group])
        return OPERATIONS[first.op](self.client, run, first.record)

    def _done(
        self, group: list[Item], result: Any = None, error: BaseException | None = None, counted: bool = True
    ) -> None:
        """`group` left the queue (lock held): sent, or given up (`counted` among the given-up calls)."""
        if error is None:
            self._outage_since = None  # the store answers
            self.report.delivered_late += sum(item.waited for item in group)
        if group[0].op == "metric":
            sent = error is None
            self.report.count(**{"sent_metrics" if sent else "dropped_metrics": len(group)})
        elif error is not None and counted:
            self.report.count(given_up_calls=1)
        self.queue.finished(group, result, error)

    def _begin_outage(self, reason: str) -> None:
        """The store is away (lock held): callers waiting for answers get None now, not minutes later."""
        self.report.count(last_error=reason)
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            self.report.outages += 1
        for item in self.queue.waiting():
            item.settle(None)
            item.waited = True
