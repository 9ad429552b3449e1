"""Training progress as a Prefect progress artifact, updated at each log interval."""

from __future__ import annotations

import logging
import time
from typing import Any
from uuid import UUID

from gptcore.train.callbacks import TrainingCallback
from gptcore.train.records import EvalRecord, StartupRecord, StepRecord, SummaryRecord
from gptcore.train.reports import startup_line

log = logging.getLogger(__name__)


class PrefectProgress(TrainingCallback):
    """Percent of planned steps done, shown on the flow run page; never stops training when it fails."""

    def __init__(self, key: str, planned_steps: int, min_interval_seconds: float = 2.0) -> None:
        self.key = key
        self.planned_steps = max(1, planned_steps)
        self.min_interval = min_interval_seconds
        self._artifact: UUID | None = None
        self._last_update = 0.0
        self.losses: list[float] = []
        self.val_losses: list[float] = []
        self.start_step = 0
        self.startup: StartupRecord | None = None  # the trainer's startup record, once it started

    def on_start(self, startup: StartupRecord) -> None:
        self.startup = startup
        self.planned_steps = max(1, startup.planned_steps or self.planned_steps)
        self.start_step = startup.start_step
        _run_logger().info("%s: %s", self.key, startup_line(startup))
        if startup.precision_warning:
            _run_logger().warning("%s: %s", self.key, startup.precision_warning)
        self._call(self._create, 100.0 * self.start_step / self.planned_steps)

    def on_step(self, record: StepRecord) -> None:
        if record.train_loss is not None:
            self.losses.append(float(record.train_loss))
            self._log_line(record)
        now = time.monotonic()
        if now - self._last_update >= self.min_interval:
            self._last_update = now
            self._call(self._update, 100.0 * record.step / self.planned_steps)

    def on_eval(self, record: EvalRecord) -> None:
        if record.val_loss is not None:
            self.val_losses.append(float(record.val_loss))

    def on_end(self, summary: SummaryRecord) -> None:
        self._call(self._update, 100.0)

    def _log_line(self, record: StepRecord) -> None:
        """One line per log interval in the run's log, so a long training shows it is alive."""
        _run_logger().info(
            "%s: step %d/%d, train_loss %.4f, %.0f tokens/s",
            self.key,
            record.step,
            self.planned_steps,
            float(record.train_loss),
            float(record.tokens_per_second or 0.0),
        )

    def _create(self, progress: float) -> None:
        from prefect.artifacts import create_progress_artifact

        self._artifact = create_progress_artifact(
            progress=min(progress, 100.0), key=self.key, description="training progress (% of planned steps)"
        )

    def _update(self, progress: float) -> None:
        from prefect.artifacts import update_progress_artifact

        if self._artifact is not None:
            update_progress_artifact(self._artifact, min(progress, 100.0))

    def _call(self, action: Any, progress: float) -> None:
        try:
            action(progress)
        except Exception as error:  # an unreachable API must not cost a training run
            log.warning("progress artifact %s not updated: %s", self.key, error)


def _run_logger() -> logging.Logger | logging.LoggerAdapter:
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        return get_run_logger()
    except MissingContextError:
        return log
