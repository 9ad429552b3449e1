"""Training progress for a person at a terminal: a live bar with the step, the losses, tokens per second
and the time left, estimated from the throughput measured so far (rich's `TimeRemainingColumn`).

Shown only when stdout is a terminal and JSON lines were not asked for (`--json`, or `GPTPIPE_JSON=1`):
scripts and pipes keep getting JSON lines alone.
"""

from __future__ import annotations

from typing import Any

from gptcore.tools.console import JSON_ONLY, wants_progress_bar
from gptcore.train.callbacks import TrainingCallback
from gptcore.train.records import EvalRecord, StartupRecord, StepRecord, SummaryRecord
from gptcore.train.reports import startup_line

__all__ = ["JSON_ONLY", "ProgressBar", "wants_progress_bar"]


class ProgressBar(TrainingCallback):
    """The bar of one training run (its `name`), on stderr so stdout stays the commands' records."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.progress: Any = None
        self.task: Any = None

    def on_start(self, startup: StartupRecord) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}  val {task.fields[val]}  {task.fields[speed]} tokens/s"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self.progress.console.print(f"{self.name}: {startup_line(startup)}", highlight=False)
        total = startup.planned_steps or startup.max_steps
        self.task = self.progress.add_task(
            self.name, total=total, completed=startup.start_step, loss="-", val="-", speed="-"
        )
        self.progress.start()

    def on_step(self, record: StepRecord) -> None:
        if self.progress is None:
            return
        fields: dict[str, int | str] = {"completed": record.step}
        if isinstance(record.train_loss, int | float):
            fields["loss"] = f"{record.train_loss:.4f}"
        if isinstance(record.tokens_per_second, int | float):
            fields["speed"] = f"{record.tokens_per_second:,.0f}"
        self.progress.update(self.task, **fields)

    def on_eval(self, record: EvalRecord) -> None:
        if self.progress is not None and isinstance(record.val_loss, int | float):
            self.progress.update(self.task, val=f"{record.val_loss:.4f}")

    def on_end(self, summary: SummaryRecord) -> None:
        self._stop()

    def on_failure(self, reason: str) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
