"""A tracking session: a checked connection to the store and the experiment runs go into.

Opening one resolves the store (`tasks.tracking.store`), proves it usable by one read (a
TrackingError before anything trains), and finds or creates the experiment. MLflow keeps the store
it opened for a URI, so opening the same store again in one process costs milliseconds: `gptpipe run`
opens it while Prefect's server starts, and the flow's own open then finds it ready.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.tracking.callback import MLflowCallback
from tasks.tracking.delivery.writer import OUTBOX_DIRECTORY
from tasks.tracking.store import TrackingTarget, connect, ensure_experiment, resolve_target
from tasks.tracking.ui import training_route, training_view_url

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from gptcore.train.callbacks import TrainingCallback
    from tasks.params.schema import PipelineParams, TrackingConfig


@dataclass
class TrackingSession:
    """A reachable store and the experiment runs go into."""

    target: TrackingTarget
    client: MlflowClient
    experiment_id: str
    experiment_name: str
    system_metrics: bool = True

    @classmethod
    def open(
        cls, config: TrackingConfig | None = None, experiment: str | None = None, root: Path | None = None
    ) -> TrackingSession:
        """Resolve and check the store (a TrackingError before anything trains), then the experiment:
        `experiment`, else the parameter file's `tracking.experiment`, else `gptpipe`."""
        target = resolve_target(config, root)
        name = experiment or (config.experiment if config is not None else None) or "gptpipe"
        client = connect(target)
        experiment_id = ensure_experiment(client, name, target)
        return cls(target, client, experiment_id, name, config.system_metrics if config is not None else True)

    def training_callback(self, run_name: str, **options: Any) -> MLflowCallback:
        """An MLflowCallback recording into this session's experiment (see MLflowCallback for options)."""
        options.setdefault("system_metrics", self.system_metrics)
        options.setdefault("outbox", self.outbox)
        return MLflowCallback(self.client, self.target.uri, self.experiment_id, run_name, **options)

    @property
    def outbox(self) -> Path:
        """Where records wait while the store is away: beside a local store, else `mlruns/outbox`."""
        database = self.target.database
        return database.parent / "outbox" if database is not None else OUTBOX_DIRECTORY.resolve()

    def run_url(self, run_id: str, ui: str | None = None) -> str:
        """Where a run is in the MLflow UI, shown as a training run: `gptpipe ui` serves the local store
        at the default address (or `ui`), through its training-view page; a tracking server's UI is asked
        for the model-training view in the address alone."""
        route = f"/experiments/{self.experiment_id}/runs/{run_id}"
        if self.target.is_http and ui is None:
            return f"{self.target.uri.rstrip('/')}/{training_route(route)}"
        return training_view_url(ui or "http://127.0.0.1:5000", route)


def run_label(params: PipelineParams, params_path: str | Path | None) -> str:
    """What a run's name says of it, for comparing runs in the UI: the iteration, the parameter file
    when it is not the iteration's own, and a short fingerprint of the parameters it ran with (its
    `--set` overrides included), so two runs of different settings never share a name."""
    from gptcore.tools.fingerprint import fingerprint

    label = f"iteration-{params.iteration}"
    stem = Path(params_path).stem if params_path else None
    if stem and stem != f"iteration_{params.iteration}":
        label = f"{label}-{stem}"
    return f"{label}-{fingerprint(params.model_dump(mode='json'), length=8)}"


def training_metadata(callbacks: list[TrainingCallback]) -> dict[str, str]:
    """The dict to pass as `TrainJob.metadata` so checkpoints carry the MLflow run id: the first
    MLflowCallback's live metadata (filled when its run opens, before any checkpoint), else a new dict."""
    for callback in callbacks:
        if isinstance(callback, MLflowCallback):
            return callback.metadata
    return {}


def open_training_run(callbacks: list[TrainingCallback], resumed_from: Path | None = None) -> None:
    """Open the MLflow run of the callbacks' MLflowCallback now (continuing the run of the checkpoint a
    resume starts from), before a launch, so the run id is in the job every rank saves checkpoints with."""
    from gptcore.checkpoint.files import latest_checkpoint

    for callback in callbacks:
        if isinstance(callback, MLflowCallback):
            callback.open(latest_checkpoint(resumed_from) if resumed_from else None)
