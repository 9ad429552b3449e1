"""The records waiting for the store, oldest first: the group in flight, then the outbox's, then
memory's. Memory holds at most `memory_records`; beyond that the oldest are spilled to the outbox, and at
the end whatever was not delivered is left there, in order, for `gptpipe tracking replay`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import Any

from tasks.tracking.delivery.operations import METRICS_PER_CALL, dumps
from tasks.tracking.delivery.outbox import Outbox
from tasks.tracking.delivery.records import CreateRun, Record
from tasks.tracking.delivery.report import WriterReport
from tasks.tracking.delivery.signing import sign


@dataclass
class Item:
    """A queued record (`record`), or a read (`call`) that is never spilled nor replayed."""

    record: Record | None = None
    call: Callable[[], Any] | None = None
    what: str = ""
    answer: Future | None = None
    queued: float = field(default_factory=time.monotonic)
    waited: bool = False  # it waited out an outage (counted as delivered late when sent)

    @property
    def op(self) -> str:
        return self.record.op if self.record is not None else self.what

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(error) if error is not None else self.answer.set_result(result)


class RecordQueue:
    """Not thread-safe on its own: the delivery loop calls it with its lock held."""

    def __init__(
        self, outbox: Outbox, report: WriterReport, memory_records: int, flush_seconds: float
    ) -> None:
        self.outbox, self.report = outbox, report
        self.memory_records = max(2, memory_records)
        self.flush_seconds = flush_seconds
        self.memory: deque[Item] = deque()  # newer than anything in the outbox
        self.inflight: list[Item] = []  # the group being sent; first again after a failure
        self.inflight_end: int | None = None  # where it ends in the outbox, when read from there
        self.ids: dict[str, str] = {}  # pending key -> the run id the store gave it

    def append(self, item: Item) -> None:
        self.memory.append(item)
        if len(self.memory) > self.memory_records:
            self.spill(len(self.memory) - self.memory_records // 2)

    def spill(self, count: int) -> None:
        """Move the `count` oldest records in memory to the outbox; reads among them are answered None."""
        oldest = [self.memory.popleft() for _ in range(count)]
        records = [item.record for item in oldest if item.record is not None]
        for item in oldest:
            item.settle(None)
        try:
            self.report.spilled_records += self.outbox.append(dumps(sign(self.named(r))) for r in records)
        except OSError as error:  # the memory bound wins over the records: counted, not silent
            lost = sum(1 for r in records if r.op == "metric")
            self.report.count(
                dropped_metrics=lost,
                given_up_calls=len(records) - lost,
                last_error=f"{self.outbox.path}: cannot spill tracking records ({error})",
            )

    def head(self, now: float) -> tuple[list[Item], float]:
        """The oldest group: the one in flight, else from the outbox, else from memory, with how long it
        may still wait (metrics wait up to `flush_seconds` to share a call)."""
        if self.inflight:
            return self.inflight, 0.0
        lines = self.outbox.read(METRICS_PER_CALL) if self.outbox.waiting else []
        if lines:
            group = same_call([Item(record=record, waited=True) for record, _ in lines])
            self.inflight, self.inflight_end = group, lines[len(group) - 1][1]
            return group, 0.0
        while self.memory and self.memory[0].record is None and self.memory[0].answer.done():
            self.memory.popleft()  # a read whose caller stopped waiting
        group = same_call(list(islice(self.memory, METRICS_PER_CALL)))
        if (
            not group
            or group[0].op != "metric"
            or len(group) == METRICS_PER_CALL
            or len(group) < len(self.memory)
        ):
            return group, 0.0
        return group, group[0].queued + self.flush_seconds - now

    def take(self, group: list[Item]) -> None:
        """`group` (the head) is being sent: taken out of memory, in flight until `finished`."""
        if not self.inflight:
            for _ in group:
                self.memory.popleft()
            self.inflight, self.inflight_end = group, None

    def finished(self, group: list[Item], result: Any = None, error: BaseException | None = None) -> None:
        """The group in flight left the queue: sent (a new run's id noted), or given up."""
        if error is None and isinstance(created := group[0].record, CreateRun):
            self.ids[created.run] = result
        group[0].settle(result, error)
        if self.inflight_end is not None:
            self.outbox.delivered(self.inflight_end, len(group))
        self.inflight, self.inflight_end = [], None

    def waiting(self) -> list[Item]:
        return [*self.inflight, *self.memory]

    def leave_in_outbox(self, store_down: bool) -> None:
        """At the end: every record not delivered goes to the outbox, in order."""
        from_memory = self.inflight if self.inflight_end is None else []  # else still in the outbox
        head = [item.record for item in from_memory if item.record is not None]
        tail = [item.record for item in self.memory if item.record is not None]
        for item in self.waiting():
            item.settle(None)
        self.inflight, self.memory = [], deque()
        if not head and not tail and not self.outbox.waiting:
            self.outbox.release()
            return
        records = (sign(self.named(record)) for record in chain(head, self.outbox.remaining(), tail))
        try:
            self.report.waiting_records = self.outbox.rewrite(records)
        except OSError as error:
            self.report.count(last_error=f"{self.outbox.path}: cannot keep the tracking records ({error})")
            return
        finally:
            self.outbox.release()  # the run is done with it: a replay may take it
        self.report.outbox = str(self.outbox.path)
        self.report.store_down = store_down

    def named(self, record: Record) -> Record:
        """`record` with its run's pending key replaced by the id, once the store gave one."""
        if not isinstance(record, CreateRun) and record.run in self.ids:
            return record.model_copy(update={"run": self.ids[record.run]})
        return record


def same_call(items: list[Item]) -> list[Item]:
    """The leading items that go in one call: consecutive metrics of one run, else the first alone."""
    if not items:
        return []
    first = items[0]
    if first.op != "metric":
        return [first]
    group = [first]
    for item in items[1:]:
        if item.op != "metric" or item.record.run != first.record.run:
            break
        group.append(item)
    return group
