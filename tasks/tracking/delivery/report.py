"""What happened to a writer's records: the counts a run's `tracking.*` tags show, and its warning."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gptcore.tools.records import JSONObject
from tasks.tracking.store import redact


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

    def as_dict(self) -> JSONObject:
        return asdict(self)

    def count(self, last_error: str | None = None, **increments: int) -> None:
        """Add `increments` to the counts; `last_error`, when given, replaces the last error."""
        for name, amount in increments.items():
            setattr(self, name, getattr(self, name) + amount)
        if last_error is not None:
            self.last_error = redact(last_error)  # MLflow's errors name the URL they called

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
