"""A flow run's MLflow record: one experiment per iteration, a parent run per flow run, a child per stage.

`PipelineRecorder` lays out a flow run: the parent run tagged with the Prefect flow run id, the
parameter file's sha256 and the git commit; one nested child run per stage, a cached stage's child tagged
`cached` with `cached_from_run_id` naming the run that produced its outputs. Training stages record
themselves through `MLflowCallback` in their stage's child run. Every call goes through one `RunWriter`,
so a store that stops answering mid-flow costs a bounded wait, never the flow.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gptcore.tools.fingerprint import sha256_file
from gptcore.tools.records import JSONObject
from gptcore.train.records import finite_metrics
from tasks.tracking.callback import RUN_ID_KEY, MLflowCallback
from tasks.tracking.datasets import token_file_inputs
from tasks.tracking.delivery.writer import RunWriter
from tasks.tracking.session import TrackingSession, run_label
from tasks.tracking.store import TrackingError, environment_tags, git_commit, redact

if TYPE_CHECKING:
    from gptcore.eval.quant_tradeoff import TradeoffRow
    from tasks.caching import StageOutcome
    from tasks.params.schema import ModelProfile, PipelineParams
    from tasks.results import StageResult
    from tasks.tracking.models.gate import BenchmarkGate
    from tasks.tracking.models.registry import Registration

TRAINING_STAGES = ("smoke", "full")


class QuantizedModels(Protocol):
    """What the quantize stage's result (`tasks.stages.quantize.QuantizeResult`, which imports this
    package) hands its record: the trade-off table's rows, the machine's facts, each method's files."""

    @property
    def rows(self) -> Sequence[TradeoffRow]: ...

    @property
    def machine(self) -> Mapping[str, object]: ...

    @property
    def model_folders(self) -> Mapping[str, str]: ...


class FlowSummary(Protocol):
    """What a flow's report (`flows.report.PipelineReport`) hands its parent run at the end: its stages'
    outcomes, its markdown and its headline figures."""

    @property
    def outcomes(self) -> Mapping[str, StageOutcome]: ...

    def markdown(self) -> str: ...

    def headline(self) -> dict[str, float]: ...


def _stage_fingerprint(result: StageResult | None) -> str | None:
    """The stage's fingerprint; for a stage never cached, a digest of its outputs' contents."""
    if result is None:
        return None
    if result.fingerprint:
        return result.fingerprint
    files = result.files
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16] if files else None


@dataclass
class PipelineRecorder:
    """A flow run's MLflow record: the parent run and its stages' child runs."""

    session: TrackingSession
    parent_run_id: str
    writer: RunWriter
    params: PipelineParams | None = None
    name: str = ""  # the parent run's: its stages' runs are named `<stage>-<name>`
    stage_runs: dict[str, str | None] = field(default_factory=dict)
    callbacks: dict[str, MLflowCallback] = field(default_factory=dict)
    data_params: dict[str, str] = field(default_factory=dict)  # the data's fingerprints, as run params
    token_files: dict[str, str] = field(default_factory=dict)  # {split: path}, once the tokens stage ran
    recorded: set[str] = field(default_factory=set)

    @classmethod
    def start(
        cls,
        params: PipelineParams,
        params_path: Path,
        flow_run_id: str = "",
        root: Path | None = None,
        trial: JSONObject | None = None,
    ) -> PipelineRecorder:
        """Check the store and open the parent run; a TrackingError (before any stage) if unreachable.
        A sweep's `trial` (its JSON: {"parent_run_id", "name", "values", "kind"}) makes it a child run of
        the sweep's run, named for the trial, with each swept key's value as a `sweep.<key>` param."""
        session = TrackingSession.open(params.tracking, root=root)
        params_path = Path(params_path)
        commit = git_commit()
        name = run_label(params, params_path)
        if trial:
            name = f"{trial['name']}-{name}"
        tags = {
            "mlflow.runName": name,
            "prefect.flow_run_id": flow_run_id or None,
            "params_file": str(params_path.resolve()),
            "params_sha256": sha256_file(params_path),
            "git_commit": commit,
            "mlflow.source.git.commit": commit,
            "iteration": params.iteration,
            "kind": trial.get("kind", "trial") if trial else "pipeline",
            "mlflow.parentRunId": trial["parent_run_id"] if trial else None,
            **environment_tags(),
        }
        writer = RunWriter(session.client, outbox=session.outbox, name="mlflow-pipeline")
        parent = writer.create_run(session.experiment_id, name, tags)
        if parent is None:
            writer.close()
            raise TrackingError(
                f"tracking store {redact(session.target.uri)} did not open the flow's run "
                f"({writer.report.last_error}); nothing was started"
            )
        recorder = cls(session, parent, writer, params, name)
        writer.log_artifact(parent, params_path, "params")
        writer.log_params(parent, params.model_params() | params.optimizer_params())
        if trial:
            swept = trial.get("values") or {}
            if isinstance(swept, dict):
                writer.log_params(parent, {f"sweep.{key}": value for key, value in swept.items()})
        return _champion_settled(recorder)

    def log_params(self, values: Mapping[str, object]) -> None:
        """More params of the flow's run (a fine-tune's base and adapters, known once the base resolved)."""
        self.writer.log_params(self.parent_run_id, values)

    def links(self) -> dict[str, str]:
        return {
            "MLflow tracking store": redact(self.session.target.uri),
            "MLflow experiment": f"{self.session.experiment_name} (id {self.session.experiment_id})",
            "MLflow run": self.session.run_url(self.parent_run_id),
        }

    # --- stages -------------------------------------------------------------------------------------

    def stage_run(self, stage: str) -> str | None:
        """The child run of `stage` under the parent, created on first use: its id, a pending key while
        the store is away (`RunWriter.create_run`), or None when the store refused it."""
        if stage not in self.stage_runs:
            tags = {"mlflow.parentRunId": self.parent_run_id, "stage": stage, "kind": "stage"}
            name = f"{stage}-{self.name}" if self.name else stage
            self.stage_runs[stage] = self.writer.create_run(self.session.experiment_id, name, tags)
        return self.stage_runs[stage]

    def _created_run(self, stage: str) -> str | None:
        """The store's id of `stage`'s run, for calls that name it themselves (registering a model):
        None while the store is away and the run not created yet."""
        run = self.stage_run(stage)
        if run is not None and self.writer.resolved(run) is None:
            self.writer.flush()  # its creation is queued ahead: a bounded wait, none while away
        return self.writer.resolved(run)

    def training_callback(self, stage: str, model: ModelProfile | None = None) -> MLflowCallback | None:
        """The callback a training stage runs with, recording into the stage's child run."""
        if stage not in self.callbacks:
            run_id = self.stage_run(stage)
            if run_id is None:
                return None  # no stage run to record into: the training goes on untracked
            section = "smoke" if stage == "smoke" else "full"  # a fine-tune trains with the full section
            # the model it builds (a start model's own, as its stage resolved it), its optimizer
            recipe = model.as_params() if model is not None else {}
            recipe |= {} if self.params is None else self.params.optimizer_params(section)
            params = {**recipe, **self.data_params}
            self.callbacks[stage] = self.session.training_callback(
                stage,
                run_id=run_id,
                parent_run_id=self.parent_run_id,
                tags={"stage": stage, "kind": "training"},
                writer=self.writer,
                params=params,
                datasets={split: path for split, path in self.token_files.items() if split != "test"},
            )
        return self.callbacks[stage]

    def training_callbacks(self, stage: str, model: ModelProfile) -> list[MLflowCallback]:
        """What a training stage trains with: the callback recording into its stage run (none when the
        store refused the run), its `metadata` what every checkpoint carries of the run."""
        callback = self.training_callback(stage, model)
        return [callback] if callback is not None else []

    def log_models(self, stage: str, checkpoints: list[Path]) -> None:
        """Checkpoints a stage wrote that training did not log (a LoRA fine-tune's merged ones) as
        logged models of the stage's run, each named for its kind (final, best)."""
        run_id = self.stage_run(stage)
        if run_id is None:
            return
        for path in checkpoints:
            self.writer.log_model(run_id, self.session.experiment_id, path, path.stem, {"stage": stage})

    def register_evaluated(
        self, name: str, checkpoint: Path, digest: str, test_bits_per_byte: float,
        lineage: dict | None = None, benchmarks: dict[str, float] | None = None,
        gate: BenchmarkGate | None = None, split: dict[str, str] | None = None,
    ) -> Registration | None:  # fmt: skip
        """The evaluated checkpoint registered as a version of `name`, champion or challenger
        (`tasks.tracking.models.registry`), a fine-tune's tagged with its `lineage`, every version with
        its `benchmarks` figures and the test `split` it was measured on, held back by the benchmark
        `gate` if given; None when the store did not answer."""
        from tasks.tracking.models.registry import register

        run_id = self._created_run("evaluate")
        if run_id is None:
            return None
        client, experiment = self.session.client, self.session.experiment_id
        arguments = (client, experiment, run_id, name, checkpoint, test_bits_per_byte, digest, lineage)
        return self.writer.ask("register", register, *arguments, benchmarks, gate, split)

    def record_quantized(
        self, name: str, result: QuantizedModels, digest: str, may_hold_champion: bool,
        split: dict[str, str] | None = None,
    ) -> dict[str, Registration | None]:  # fmt: skip
        """The quantize stage's table and models in MLflow (`quantized.record_tradeoff`, each step through
        the writer), measured on the test `split`: each method's registration (None: the store was away)."""
        from tasks.tracking.models.quantized import record_tradeoff

        if (stage_run := self.stage_run("quantize")) is not None:
            machine = {f"machine.{key}": value for key, value in result.machine.items()}
            self.writer.log_params(stage_run, machine)
        run_id = self._created_run("quantize")
        if run_id is None:
            return {}
        client, experiment = self.session.client, self.session.experiment_id
        rows, folders = list(result.rows), dict(result.model_folders)
        arguments = (rows, folders, digest, may_hold_champion, self.writer.ask, split)
        return record_tradeoff(client, experiment, run_id, name, *arguments)

    def producing_run(self, stage: str, fingerprint: str, exclude: str) -> str | None:
        """The latest child run that really ran `stage` with this fingerprint (not a cached one)."""
        query = (
            f"tags.stage = '{stage}' and tags.stage_fingerprint = '{fingerprint}' and tags.cached = 'false'"
        )
        runs = self.writer.ask(
            "search_runs",
            self.session.client.search_runs,
            [self.session.experiment_id],
            query,
            order_by=["attributes.start_time DESC"],
            max_results=5,
        )
        return next((run.info.run_id for run in runs or [] if run.info.run_id != exclude), None)

    def record_stage(self, outcome: StageOutcome) -> str | None:
        """Record a stage's outcome (name, state, result, seconds, message) in its child run; end it."""
        result = outcome.result
        name, state = outcome.name, outcome.state
        manifest = result.model_dump(mode="json") if result is not None else {}
        run_id = self.stage_run(name)
        self.recorded.add(name)
        if name == "tokens" and result is not None and result.fingerprint:
            self.data_params["data.tokens_fingerprint"] = result.fingerprint
            self.token_files = {split: str(manifest[split]) for split in ("train", "validation", "test")}
        if name == "tokenizer" and result is not None and result.fingerprint:
            self.data_params["data.tokenizer_fingerprint"] = result.fingerprint
        if run_id is None:
            return None
        fingerprint = _stage_fingerprint(result)
        tags: dict[str, str | float | None] = {
            "state": state,
            "cached": "true" if state == "cached" else "false",
            "stage_fingerprint": fingerprint,
            "stage_seconds": outcome.seconds,
            "message": outcome.message[:5000] or None,
        }
        if state == "cached" and fingerprint:
            tags["cached_from_run_id"] = self.producing_run(name, fingerprint, run_id) or "unknown"
        self.writer.set_tags(run_id, tags)
        callback = self.callbacks.get(name)
        trained_here = callback is not None and callback.metadata.get(RUN_ID_KEY) is not None
        if not trained_here:  # the callback logged training figures itself
            figures = result.figures if result is not None else {}
            self.writer.log_metrics(run_id, finite_metrics(figures, tuple(figures)), 0)
        if result is not None and name not in TRAINING_STAGES:
            self._log_manifest(run_id, manifest, result.files)
        if name == "evaluate" and "test" in self.token_files:
            self.writer.log_inputs(run_id, token_file_inputs({"test": self.token_files["test"]}))
        self.writer.set_terminated(run_id, "FAILED" if state == "failed" else "FINISHED")
        return run_id

    def _log_manifest(self, run_id: str, manifest: JSONObject, files: Mapping[str, str]) -> None:
        """The stage manifest (its result's JSON), and the JSON and markdown files among its outputs
        (tokenizer.json, token manifests, the evaluation and its samples)."""
        self.writer.log_dict(run_id, manifest, "stage_manifest.json")
        for path in files:
            if path.endswith((".json", ".md")):
                self.writer.log_artifact(run_id, Path(path), "outputs")

    def finish(self, report: FlowSummary | None = None, failed: bool | None = None) -> None:
        """End the parent run: FAILED when any stage failed (one of the `report`'s, or as `failed` says),
        the report's markdown its `summary.md` and its headline figures its metrics."""
        if failed is None:
            outcomes = report.outcomes.values() if report is not None else ()
            failed = any(outcome.state == "failed" for outcome in outcomes)
        for stage, run_id in self.stage_runs.items():
            callback = self.callbacks.get(stage)
            opened = callback is not None and callback.metadata.get(RUN_ID_KEY)
            if run_id is not None and stage not in self.recorded and not opened:
                # A stage that never ran nor was recorded (failed before start, flow stopped).
                self.writer.set_terminated(run_id, "KILLED")
        if report is not None:
            self.writer.log_text(self.parent_run_id, report.markdown(), "summary.md")
            figures = report.headline()
            self.writer.log_metrics(self.parent_run_id, finite_metrics(figures, tuple(figures)), 0)
        self.writer.flush()
        self.writer.set_tags(self.parent_run_id, {"tracking.failed_calls": self.writer.report.failed_calls})
        self.writer.set_terminated(self.parent_run_id, "FAILED" if failed else "FINISHED")
        warning = self.writer.close().warning(f"MLflow run {self.writer.resolved(self.parent_run_id)}")
        if warning and self.writer.report.waiting_records:  # failures alone are the stage runs' tags
            print(warning, file=sys.stderr, flush=True)


def _champion_settled(recorder: PipelineRecorder) -> PipelineRecorder:
    """The run's registered model's `@champion` settled at the run's start (`registry.settle_champion`:
    a racer killed right after a stale set is put right); bounded, nothing while the store is away."""
    from tasks.tracking.models.registry import registered_name, settle_champion

    name = registered_name(recorder.params)
    recorder.writer.ask("settle_champion", settle_champion, recorder.session.client, name)
    return recorder
