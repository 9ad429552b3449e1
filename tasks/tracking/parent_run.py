"""A run other runs are children of, opened by a flow or a command: a comparison's, a sweep's, a
fine-tune's methods', an import's, a quantization's. The one way such a run is set up, given its
tables, and ended.

Its calls go to the store at once rather than through a `RunWriter`: the flow that opens it waits for
the answers (the run's id, before any child starts), and no training waits on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptcore.tools.records import JSONObject
from gptcore.train.records import table_columns
from tasks.tracking.callback import MLflowCallback
from tasks.tracking.delivery.operations import PARAM_VALUE_LIMIT
from tasks.tracking.session import TrackingSession

if TYPE_CHECKING:
    from gptcore.export.model_files import ModelFiles
    from tasks.params.schema import TrackingConfig
    from tasks.tracking.models.registry import Registration


@dataclass(frozen=True)
class ParentRun:
    """One run of a session's experiment, and what flows do with it."""

    session: TrackingSession
    run_id: str

    @classmethod
    def open(cls, config: TrackingConfig, run_name: str, tags: dict[str, str]) -> ParentRun:
        """Check the store (a TrackingError before anything trains), then open the run in the parameter
        file's experiment."""
        return cls.start(TrackingSession.open(config), run_name, tags)

    @classmethod
    def start(cls, session: TrackingSession, run_name: str, tags: dict[str, str]) -> ParentRun:
        """Open the run in `session`'s experiment (a store already checked)."""
        run = session.client.create_run(session.experiment_id, run_name=run_name, tags=tags)
        return cls(session, run.info.run_id)

    @property
    def url(self) -> str:
        """Where the run is in the MLflow UI."""
        return self.session.run_url(self.run_id)

    def child_callback(self, run_name: str, **options: Any) -> MLflowCallback:
        """The callback of a training run recorded as this run's child (`MLflowCallback`'s options)."""
        return self.session.training_callback(run_name, parent_run_id=self.run_id, **options)

    def child_metrics(self, name_start: str) -> dict[str, float]:
        """The metrics of this run's child whose name starts with `name_start` (a sweep's trial's run:
        `<trial>-<run label>`); empty while it has none."""
        query = f"tags.mlflow.parentRunId = '{self.run_id}' and attributes.run_name LIKE '{name_start}%'"
        runs = self.session.client.search_runs([self.session.experiment_id], query, max_results=1)
        return dict(runs[0].data.metrics) if runs else {}

    def log_params(self, values: dict[str, str]) -> None:
        """Params of the run, each cut to the length MLflow keeps."""
        for key, value in values.items():
            self.session.client.log_param(self.run_id, key, value[:PARAM_VALUE_LIMIT])

    def log_table(self, rows: list[JSONObject], file: str) -> None:
        """Rows (dicts with the same keys) as the run's table artifact `file` (MLflow's table view)."""
        self.session.client.log_table(self.run_id, table_columns(rows), file)

    def log_metrics(self, values: dict[str, float]) -> None:
        """Metrics of the run, at step 0."""
        for key, value in values.items():
            self.session.client.log_metric(self.run_id, key, value)

    def log_file(self, path: Path, folder: str | None = None) -> None:
        """A file as an artifact of the run (a PNG shows in the MLflow UI's artifact view)."""
        self.session.client.log_artifact(self.run_id, str(path), folder)

    def set_tag(self, key: str, value: str) -> None:
        self.session.client.set_tag(self.run_id, key, value)

    def log_text(self, text: str, file: str) -> None:
        self.session.client.log_text(self.run_id, text, file)

    def log_dict(self, data: JSONObject, file: str) -> None:
        self.session.client.log_dict(self.run_id, data, file)

    def register_imported(self, name: str, files: ModelFiles, lineage: dict[str, str]) -> Registration:
        """An imported model's files logged as a model of this run and registered as a version of `name`
        (`registry.register_imported`)."""
        from tasks.tracking.models.registry import register_imported

        session = self.session
        return register_imported(session.client, session.experiment_id, self.run_id, name, files, lineage)

    def finish(self, done: bool = True) -> None:
        """End the run: FINISHED when `done`, else FAILED."""
        self.session.client.set_terminated(self.run_id, "FINISHED" if done else "FAILED")

    def fail(self, reason: str) -> None:
        """End the run FAILED, `reason` (one line) its tag `failure_reason`."""
        self.session.client.set_tag(self.run_id, "failure_reason", reason)
        self.finish(done=False)
