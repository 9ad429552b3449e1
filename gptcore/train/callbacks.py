"""The trainer's progress interface. Adapters (MLflow, Prefect artifacts, the console) implement it."""

from __future__ import annotations

from pathlib import Path

from gptcore.train.records import EvalRecord, StartupRecord, StepRecord, SummaryRecord

# A checkpoint written: its step, kind (latest/best/final) and the seconds its write took, by those names
# (a launched rank's JSON line carries the same).
CheckpointInfo = dict[str, str | int | float]


class TrainingCallback:
    """No-op base: subclasses override what they need. Each event is the trainer's record
    (`gptcore.train.records`), read by attribute under the run-record names (`tokens_per_second`,
    `peak_memory_bytes`, ...)."""

    def on_start(self, startup: StartupRecord) -> None:
        """The startup record: device, precision, batch size, parameter count, estimates."""

    def on_step(self, record: StepRecord) -> None:
        """One log interval: step, train_loss, learning_rate, grad_norm, tokens_per_second, ..."""

    def on_eval(self, record: EvalRecord) -> None:
        """One evaluation: step, val_loss, val_perplexity (and unigram_val_loss on the first)."""

    def on_checkpoint(self, path: Path, info: CheckpointInfo) -> None:
        """A checkpoint was written completely; info holds step, kind (latest/best/final), seconds."""

    def on_end(self, summary: SummaryRecord) -> None:
        """Training finished; the summary record."""

    def on_failure(self, reason: str) -> None:
        """Training stopped with an error; reason is the one-line message."""


class CallbackList(TrainingCallback):
    """Fans each event out to several callbacks, in order."""

    def __init__(self, callbacks: list[TrainingCallback] | None = None) -> None:
        self.callbacks = list(callbacks or [])

    def on_start(self, startup: StartupRecord) -> None:
        for callback in self.callbacks:
            callback.on_start(startup)

    def on_step(self, record: StepRecord) -> None:
        for callback in self.callbacks:
            callback.on_step(record)

    def on_eval(self, record: EvalRecord) -> None:
        for callback in self.callbacks:
            callback.on_eval(record)

    def on_checkpoint(self, path: Path, info: CheckpointInfo) -> None:
        for callback in self.callbacks:
            callback.on_checkpoint(path, info)

    def on_end(self, summary: SummaryRecord) -> None:
        for callback in self.callbacks:
            callback.on_end(summary)

    def on_failure(self, reason: str) -> None:
        for callback in self.callbacks:
            callback.on_failure(reason)
