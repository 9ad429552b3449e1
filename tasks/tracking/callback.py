"""The MLflow side of a training run: a `TrainingCallback` that records it under the run-record names.

Every call goes through a `RunWriter` (`tasks.tracking.delivery.writer`), so a training step never waits on
the
store, and a store that goes away costs the training nothing: records wait (in memory, then in an
outbox file) and reach the store in order when it returns, or stay in the outbox for
`gptpipe tracking replay` when it never does. A run whose creation falls in an outage is created when
the store returns. Failed calls are retried and counted; the counts are reported at the end (stderr
and the run's `tracking.*` tags). Every call names its run: MLflow's active run is per thread, and
Prefect runs tasks on worker threads.

A resumed training continues its own run: the run id travels in each checkpoint's metadata
(`self.metadata`, which the trainer writes into every checkpoint record), and `open` finds it again
from the checkpoint a resume starts from.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from gptcore.errors import CheckpointError
from gptcore.tools.records import JSONObject
from gptcore.train.callbacks import CheckpointInfo, TrainingCallback
from gptcore.train.records import EvalRecord, StartupRecord, StepRecord, SummaryRecord
from tasks.tracking.datasets import token_file_inputs
from tasks.tracking.delivery.writer import DeliverySettings, RunWriter
from tasks.tracking.store import redact

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from tasks.tracking.system_metrics import WriterSystemMetrics

RUN_ID_KEY = "mlflow_run_id"


class MLflowCallback(TrainingCallback):
    """Records one training run in MLflow: params at start, metrics per interval and evaluation,
    end figures, the final and best checkpoints as artifacts, the latest checkpoint path as a tag."""

    def __init__(
        self,
        client: MlflowClient,
        tracking_uri: str,
        experiment_id: str,
        run_name: str,
        *,
        run_id: str | None = None,
        parent_run_id: str | None = None,
        tags: dict[str, str] | None = None,
        params: Mapping[str, object] | None = None,
        artifacts: list[Path] | None = None,
        datasets: Mapping[str, str | Path] | None = None,
        system_metrics: bool = True,
        log_checkpoints: bool = True,
        delivery: DeliverySettings = DeliverySettings(),
        outbox: Path | None = None,
        writer: RunWriter | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.client = client
        self.tracking_uri = tracking_uri
        self.experiment_id = experiment_id
        self.run_name = run_name
        self.run_id = run_id
        self.parent_run_id = parent_run_id
        self.tags = dict(tags or {})
        self.params = dict(params or {})
        self.artifacts = list(artifacts or [])
        self.datasets = dict(datasets or {})  # {split: token file}: the run's dataset inputs
        self.system_metrics = system_metrics
        self.log_checkpoints = log_checkpoints
        # A writer shared with the caller (a pipeline's stage runs) is the caller's to close: one
        # queue keeps a stage run's creation before its records, even when both wait out an outage.
        self._owns_writer = writer is None
        self.writer = writer or RunWriter(client, delivery=delivery, outbox=outbox, name=f"mlflow-{run_name}")
        self.writer.on_created(self._created)
        self.stream = stream
        # The trainer writes this dict into every checkpoint record (TrainJob.metadata): pass it there.
        self.metadata: dict[str, str] = {}
        self.continued = False
        self.checkpoints: dict[str, Path] = {}
        self.models: dict[str, str] = {}  # checkpoint kind -> logged model id
        self.report: JSONObject = {}  # the run's id and status, and its writer's counts (`WriterReport`)
        self._opened = False
        self._monitor: WriterSystemMetrics | None = None
        self._closed = False

    # --- the run ----------------------------------------------------------------------------------

    def _prior_run(self, resumed_from: str | Path | None) -> str | None:
        """The run a resumed checkpoint was recorded in, when that run is in this store."""
        if not resumed_from:
            return None
        from gptcore.checkpoint.files import checkpoint_metadata

        try:
            prior = checkpoint_metadata(Path(resumed_from)).metadata.get(RUN_ID_KEY)
        except Exception:  # an unreadable record: the trainer itself reports it
            return None
        if not prior:
            return None
        if not self.writer.ask("get_run", _run_exists, self.client, prior):
            return None  # a checkpoint from another store (or none answering): start a fresh run
        return prior

    def open(self, resumed_from: str | Path | None = None) -> str | None:
        """Decide the run (continue the checkpoint's, use the given one, or create one); idempotent.
        None when the store did not answer: the training then goes on untracked."""
        if self._opened:
            return self.run_id
        self._opened = True
        prior = self._prior_run(resumed_from)
        if prior is not None:
            if self.run_id and self.run_id != prior:
                # The caller's run (a pipeline stage's child) points at the line training continues.
                self.writer.set_tags(self.run_id, {"continued_run_id": prior})
            self.writer.update_run(prior, "RUNNING")
            self.run_id, self.continued = prior, True
        elif self.run_id is None:
            tags = {
                "mlflow.runName": self.run_name,
                **self.tags,
                "mlflow.parentRunId": self.parent_run_id,
            }
            self.run_id = self.writer.create_run(self.experiment_id, self.run_name, tags)
        if self.run_id is None:
            self._warn(
                f"warning: MLflow run {self.run_name!r} could not be created "
                f"({self.writer.report.last_error}); training goes on without tracking"
            )
            return None
        if self.writer.resolved(self.run_id) is None:
            self._warn(
                f"warning: MLflow run {self.run_name!r} waits for the tracking store "
                f"({self.writer.report.last_error}); training goes on, and its records follow when "
                "the store returns"
            )
        else:
            self._created(self.run_id, self.run_id)
        return self.run_id

    def _created(self, key: str, run_id: str) -> None:
        """The run exists in the store: checkpoints written from now on carry its id."""
        if key == self.run_id:
            self.metadata.update({RUN_ID_KEY: run_id, "mlflow_tracking_uri": redact(self.tracking_uri)})

    def _start_system_metrics(self) -> None:
        if not self.system_metrics:
            return
        from tasks.tracking.system_metrics import WriterSystemMetrics

        try:
            self._monitor = WriterSystemMetrics(self.writer, self.run_id, resume=self.continued)
            self._monitor.start()
        except Exception as error:  # psutil missing or the like: training goes on without
            self.writer.note(f"system metrics: {error}")
            self._monitor = None

    # --- TrainingCallback --------------------------------------------------------------------------

    def on_start(self, startup: StartupRecord) -> None:
        if self.open(startup.resumed_from) is None:
            return
        run_id = self.run_id
        self.writer.log_params(
            run_id, {**StartupRecord.params(startup), **self.params}, keep_existing=self.continued
        )
        self.writer.set_tags(
            run_id,
            {
                "checkpoint_directory": startup.checkpoint_directory,
                "start_step": startup.start_step,
                "resumed_from": startup.resumed_from,
                "dry_run": startup.dry_run,
                **({} if self.continued else self.tags),
            },
        )
        for path in self.artifacts:
            self.writer.log_artifact(run_id, Path(path), "inputs")
        if not self.continued:  # a resumed run declared its inputs when it started
            self.writer.log_inputs(run_id, token_file_inputs(self.datasets))
        self._start_system_metrics()

    def on_step(self, record: StepRecord) -> None:
        if self.run_id is not None:
            self.writer.log_metrics(self.run_id, StepRecord.metrics(record), record.step)

    def on_eval(self, record: EvalRecord) -> None:
        if self.run_id is not None:
            self.writer.log_metrics(self.run_id, EvalRecord.metrics(record), record.step)

    def on_checkpoint(self, path: Path, info: CheckpointInfo) -> None:
        kind = str(info.get("kind", "step"))
        self.checkpoints["latest" if kind == "step" else kind] = Path(path)
        self.checkpoints["newest"] = Path(path)
        if self.run_id is not None:
            self.writer.set_tags(self.run_id, {"latest_checkpoint": str(Path(path).resolve())})

    def on_end(self, summary: SummaryRecord) -> None:
        if self.run_id is not None:
            self.writer.log_metrics(self.run_id, SummaryRecord.metrics(summary), summary.steps)
            if self.log_checkpoints:
                for kind in ("final", "best"):
                    if kind in self.checkpoints:
                        self._log_checkpoint(self.checkpoints[kind], kind)
                        self._log_model(self.checkpoints[kind], kind)
        self._finish("FINISHED", {})

    def on_failure(self, reason: str) -> None:
        self._finish("FAILED", {"failure_reason": reason[:5000]})

    # --- the end ------------------------------------------------------------------------------------

    def _log_checkpoint(self, path: Path, kind: str) -> None:
        self.writer.log_artifact(self.run_id, path, f"checkpoints/{kind}")
        self.writer.log_artifact(self.run_id, path.with_suffix(".json"), f"checkpoints/{kind}")

    def _log_model(self, path: Path, kind: str) -> None:
        """The checkpoint as a logged model of this run (`self.models[kind]` its id, when the store
        answered in time; during an outage the model is logged when the store returns). A LoRA run's
        checkpoints hold the adapted model: its model is logged by the merge step, merged."""
        from gptcore.checkpoint.files import checkpoint_metadata
        from gptcore.checkpoint.load import holds_adapters

        try:
            adapted = holds_adapters(checkpoint_metadata(path))
        except CheckpointError:  # no model to log: said by the writer, as the checkpoint's business
            adapted = False
        if adapted:
            return
        model_id = self.writer.log_model(
            self.run_id, self.experiment_id, path, kind, {"stage": self.run_name}
        )
        if model_id:
            self.models[kind] = model_id

    def _finish(self, status: str, tags: dict[str, str]) -> None:
        if self._closed:
            return
        self._closed = True
        if self._monitor is not None:
            self._monitor.finish(self.writer.answer_seconds)
        if self.run_id is not None:
            self.writer.flush()  # the counts below include every metric sent or lost
            report = self.writer.report
            self.writer.set_tags(
                self.run_id,
                {
                    **tags,
                    "tracking.failed_calls": report.failed_calls,
                    "tracking.dropped_metrics": report.dropped_metrics,
                },
            )
            self.writer.set_terminated(self.run_id, status)
        report = self.writer.close() if self._owns_writer else self.writer.report
        self.run_id = self.writer.resolved(self.run_id) or self.run_id
        self.report = {"run_id": self.run_id, "status": status, **report.as_dict()}
        warning = report.warning(f"MLflow run {self.run_id}") if self._owns_writer else None
        if warning:
            self._warn(warning)

    def _warn(self, message: str) -> None:
        print(message, file=self.stream or sys.stderr, flush=True)


def _run_exists(client: MlflowClient, run_id: str) -> bool:
    try:
        client.get_run(run_id)
    except Exception:  # MLflow's "not found" for a run of another store, among others
        return False
    return True
