"""MLflow tracking: one experiment per iteration, a parent run per flow run, a child run per stage.

`TrackingSession` is a checked connection to the store (see `tasks.tracking_store`) and one experiment;
`PipelineRecorder` lays out a flow run in it: the parent run tagged with the Prefect flow run id, the
parameter file's sha256 and the git commit; one nested child run per stage, a cached stage's child tagged
`cached` with `cached_from_run_id` naming the run that produced its outputs. Training stages record
themselves through `MLflowCallback` (`tasks.tracking_callback`) in their stage's child run.

Run ids are passed explicitly everywhere: nothing uses MLflow's thread-local active run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptcore.fingerprint import sha256_file
from gptcore.records import finite_metrics, profile_params
from tasks.tracking_callback import RUN_ID_KEY, MLflowCallback, Resilient
from tasks.tracking_store import (
    TrackingError,
    TrackingTarget,
    connect,
    ensure_experiment,
    environment_tags,
    git_commit,
    redact,
    resolve_target,
)

__all__ = [
    "RUN_ID_KEY",
    "MLflowCallback",
    "PipelineRecorder",
    "TrackingError",
    "TrackingSession",
    "TrackingTarget",
    "open_training_run",
    "resolve_target",
    "training_metadata",
]

TRAINING_STAGES = ("smoke", "full")
_FILES_KEY = "files"  # a stage manifest's {path: sha256} of its outputs (tasks.caching.FILES_KEY)
# Sessions `TrackingSession.prepare` opened ahead of their use, by (store uri, experiment name).
_PREPARED: dict[tuple[str, str], TrackingSession] = {}


@dataclass
class TrackingSession:
    """A reachable store and the experiment runs go into."""

    target: TrackingTarget
    client: Any
    experiment_id: str
    experiment_name: str
    system_metrics: bool = True

    @classmethod
    def open(
        cls, config: Any = None, experiment: str | None = None, root: Path | None = None
    ) -> TrackingSession:
        """Resolve and check the store (a TrackingError before anything trains), then the experiment.

        `config` is the parameter file's `tracking` section (a TrackingConfig) or None. A session made
        ready by `prepare` for the same store and experiment is taken instead of connecting again."""
        target = resolve_target(config, root)
        name = experiment or getattr(config, "experiment", None) or "gptpipe"
        system_metrics = bool(getattr(config, "system_metrics", True))
        prepared = _PREPARED.pop((target.uri, name), None)
        if prepared is not None:
            prepared.system_metrics = system_metrics
            return prepared
        client = connect(target)
        experiment_id = ensure_experiment(client, name, target)
        return cls(target, client, experiment_id, name, system_metrics)

    @classmethod
    def prepare(cls, config: Any = None, experiment: str | None = None, root: Path | None = None) -> None:
        """Connect now, for the next `open` of the same store and experiment in this process.

        Importing MLflow and opening its store take over a second; `gptpipe run` does it while Prefect's
        server starts, and a store that cannot be used stops the command before the flow begins."""
        session = cls.open(config, experiment, root)
        _PREPARED[(session.target.uri, session.experiment_name)] = session

    def training_callback(self, run_name: str, **options: Any) -> MLflowCallback:
        """An MLflowCallback recording into this session's experiment (see MLflowCallback for options)."""
        options.setdefault("system_metrics", self.system_metrics)
        return MLflowCallback(self.client, self.target.uri, self.experiment_id, run_name, **options)

    def run_url(self, run_id: str, ui: str | None = None) -> str:
        """Where a run is in the MLflow UI (`gptpipe ui` serves the local store at the default address)."""
        base = ui or (self.target.uri if self.target.is_http else "http://127.0.0.1:5000")
        return f"{base.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{run_id}"


def training_metadata(callbacks: list[Any]) -> dict[str, Any]:
    """The dict to pass as `TrainJob.metadata` so checkpoints carry the MLflow run id: the first
    MLflowCallback's live metadata (filled when its run opens, before any checkpoint), else a new dict."""
    for callback in callbacks:
        if isinstance(callback, MLflowCallback):
            return callback.metadata
    return {}


def open_training_run(callbacks: list[Any], resumed_from: Path | None = None) -> None:
    """Open the MLflow run of the callbacks' MLflowCallback now (continuing the run of the checkpoint a
    resume starts from), before a launch, so the run id is in the job every rank saves checkpoints with."""
    from gptcore.checkpoint import latest_checkpoint

    for callback in callbacks:
        if isinstance(callback, MLflowCallback):
            callback.open(latest_checkpoint(resumed_from) if resumed_from else None)


def _stage_fingerprint(manifest: dict[str, Any]) -> str | None:
    if manifest.get("fingerprint"):
        return str(manifest["fingerprint"])
    files = manifest.get(_FILES_KEY)
    return sha256_text(json.dumps(files, sort_keys=True)) if files else None


def sha256_text(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class PipelineRecorder:
    """A flow run's MLflow record: the parent run and its stages' child runs."""

    session: TrackingSession
    parent_run_id: str
    params: Any = None
    stage_runs: dict[str, str] = field(default_factory=dict)
    callbacks: dict[str, MLflowCallback] = field(default_factory=dict)
    data_params: dict[str, Any] = field(default_factory=dict)
    recorded: set[str] = field(default_factory=set)
    calls: Resilient = field(default_factory=Resilient)

    @classmethod
    def start(
        cls, params: Any, params_path: Path, flow_run_id: str = "", root: Path | None = None
    ) -> PipelineRecorder:
        """Check the store and open the parent run; a TrackingError (before any stage) if unreachable."""
        session = TrackingSession.open(params.tracking, root=root)
        params_path = Path(params_path)
        commit = git_commit()
        tags = {
            "mlflow.runName": f"iteration-{params.iteration}-{params_path.stem}",
            "prefect.flow_run_id": flow_run_id or None,
            "params_file": str(params_path.resolve()),
            "params_sha256": sha256_file(params_path),
            "git_commit": commit,
            "mlflow.source.git.commit": commit,
            "iteration": params.iteration,
            "kind": "pipeline",
            **environment_tags(),
        }
        clean = {k: redact(v) for k, v in tags.items() if v is not None}
        run = session.client.create_run(session.experiment_id, run_name=clean["mlflow.runName"], tags=clean)
        recorder = cls(session, run.info.run_id, params)
        recorder._call(
            "log_artifact", session.client.log_artifact, recorder.parent_run_id, str(params_path), "params"
        )
        recorder._call("log_params", recorder._log_params, recorder.parent_run_id, profile_params(params))
        return recorder

    # --- plumbing -----------------------------------------------------------------------------------

    def _call(self, what: str, function: Any, *args: Any, **kwargs: Any) -> bool:
        return self.calls.call(what, function, *args, **kwargs)

    def _log_params(self, run_id: str, values: dict[str, Any]) -> None:
        from mlflow.entities import Param

        self.session.client.log_batch(run_id, params=[Param(k, redact(v)) for k, v in values.items()])

    def _set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        batch = [RunTag(k, redact(v)) for k, v in tags.items() if v is not None]
        self._call("set_tags", self.session.client.log_batch, run_id, tags=batch)

    def links(self) -> dict[str, str]:
        return {
            "MLflow tracking store": redact(self.session.target.uri),
            "MLflow experiment": f"{self.session.experiment_name} (id {self.session.experiment_id})",
            "MLflow run": self.session.run_url(self.parent_run_id),
        }

    # --- stages -------------------------------------------------------------------------------------

    def stage_run(self, stage: str) -> str:
        """The child run of `stage` under the parent, created on first use."""
        if stage not in self.stage_runs:
            tags = {
                "mlflow.parentRunId": self.parent_run_id,
                "mlflow.runName": stage,
                "stage": stage,
                "kind": "stage",
            }
            run = self.session.client.create_run(self.session.experiment_id, run_name=stage, tags=tags)
            self.stage_runs[stage] = run.info.run_id
        return self.stage_runs[stage]

    def training_callback(self, stage: str) -> MLflowCallback:
        """The callback a training stage runs with, recording into the stage's child run."""
        if stage not in self.callbacks:
            params = {**(profile_params(self.params) if self.params is not None else {}), **self.data_params}
            self.callbacks[stage] = self.session.training_callback(
                stage,
                run_id=self.stage_run(stage),
                parent_run_id=self.parent_run_id,
                tags={"stage": stage, "kind": "training"},
                params=params,
            )
        return self.callbacks[stage]

    def context(self, stage: str) -> dict[str, Any]:
        """What a training task needs: its callback (its `metadata` goes into TrainJob.metadata), ids."""
        callback = self.training_callback(stage)
        return {
            "callbacks": [callback],
            "tracking_uri": redact(self.session.target.uri),
            "experiment_id": self.session.experiment_id,
            "parent_run_id": self.parent_run_id,
            "run_id": callback.run_id,
        }

    def producing_run(self, stage: str, fingerprint: str, exclude: str) -> str | None:
        """The latest child run that really ran `stage` with this fingerprint (not a cached one)."""
        query = (
            f"tags.stage = '{stage}' and tags.stage_fingerprint = '{fingerprint}' and tags.cached = 'false'"
        )
        try:
            runs = self.session.client.search_runs(
                [self.session.experiment_id], query, order_by=["attributes.start_time DESC"], max_results=5
            )
        except Exception:
            return None
        return next((run.info.run_id for run in runs if run.info.run_id != exclude), None)

    def record_stage(self, outcome: Any) -> str:
        """Record a StageOutcome (name, state, result, seconds, message) in its child run; end it."""
        result = outcome.result
        name, state = outcome.name, outcome.state
        manifest = result.model_dump(mode="json") if result is not None else {}
        run_id = self.stage_run(name)
        fingerprint = _stage_fingerprint(manifest)
        tags: dict[str, Any] = {
            "state": state,
            "cached": "true" if state == "cached" else "false",
            "stage_fingerprint": fingerprint,
            "stage_seconds": outcome.seconds,
            "message": outcome.message[:5000] or None,
        }
        if state == "cached" and fingerprint:
            tags["cached_from_run_id"] = self.producing_run(name, fingerprint, run_id) or "unknown"
        if name == "tokens" and manifest.get("fingerprint"):
            self.data_params["data.tokens_fingerprint"] = manifest["fingerprint"]
        if name == "tokenizer" and manifest.get("fingerprint"):
            self.data_params["data.tokenizer_fingerprint"] = manifest["fingerprint"]
        self._set_tags(run_id, tags)
        callback = self.callbacks.get(name)
        trained_here = callback is not None and callback.metadata.get(RUN_ID_KEY) is not None
        if not trained_here:  # the callback logged training figures itself
            figures = manifest.get("figures", {})
            metrics = finite_metrics(figures, tuple(figures))
            self._log_metrics(run_id, metrics)
        if manifest and name not in TRAINING_STAGES:
            self._log_manifest(run_id, manifest)
        status = "FAILED" if state == "failed" else "FINISHED"
        self._call("set_terminated", self.session.client.set_terminated, run_id, status)
        self.recorded.add(name)
        return run_id

    def _log_metrics(self, run_id: str, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        if metrics:
            batch = [Metric(k, v, 0, 0) for k, v in metrics.items() if math.isfinite(v)]
            self._call("log_metrics", self.session.client.log_batch, run_id, metrics=batch)

    def _log_manifest(self, run_id: str, manifest: dict[str, Any]) -> None:
        """The stage manifest, and the JSON files among its outputs (tokenizer.json, token manifests)."""
        client = self.session.client
        self._call(
            "log_dict",
            client.log_dict,
            run_id,
            json.loads(json.dumps(manifest, default=str)),
            "stage_manifest.json",
        )
        for path in manifest.get(_FILES_KEY, {}):
            if str(path).endswith(".json") and Path(path).is_file():
                self._call("log_artifact", client.log_artifact, run_id, str(path), "outputs")

    def finish(self, report: Any = None, failed: bool | None = None) -> None:
        """End the parent run: FAILED when any stage failed (from `report.to_dict()` or `failed`)."""
        if failed is None:
            stages = (
                (report.to_dict() if hasattr(report, "to_dict") else {}).get("stages", []) if report else []
            )
            failed = any(stage.get("state") == "failed" for stage in stages)
        for stage, run_id in self.stage_runs.items():
            callback = self.callbacks.get(stage)
            opened = callback is not None and callback.metadata.get(RUN_ID_KEY)
            if stage not in self.recorded and not opened:
                # A stage that never ran nor was recorded (failed before start, flow stopped).
                self._call("set_terminated", self.session.client.set_terminated, run_id, "KILLED")
        if report is not None and hasattr(report, "markdown"):
            self._call(
                "log_text", self.session.client.log_text, self.parent_run_id, report.markdown(), "summary.md"
            )
        self._set_tags(self.parent_run_id, {"tracking.failed_calls": self.calls.failed_calls})
        self._call(
            "set_terminated",
            self.session.client.set_terminated,
            self.parent_run_id,
            "FAILED" if failed else "FINISHED",
        )
