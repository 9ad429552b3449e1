"""The fine-tune flows: a trained model adapted to new text, LoRA and full fine-tuning side by side (and
QLoRA beside both when it is the method asked for).

`finetune_method` is one method's pipeline: base model → token files of the new corpus (with the base's
tokenizer) → device check → smoke → fine-tune → merge (LoRA's adapters folded into the weights: what
every later stage reads) → held-out evaluation (registered as a version of
`gptpipe-iteration-N-<name>` with its lineage; the champion rule on the new corpus's test split) →
before/after on the new and the base corpus's test splits. `finetune` runs it for each method the
parameter file asks for, each as a child run of one comparison run, and publishes their table: what
each cost (trainable parameters, optimizer state, peak memory, tokens/s) and gained (bits per byte).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from flows.environment.prefect_settings import hide_user_error_tracebacks
from flows.failure_hooks import record_failure
from flows.report import PipelineReport
from flows.trials import TableRun
from gptcore.errors import first_line
from gptcore.tools.markdown import cell, table
from tasks import pipeline as stages
from tasks.params.loading import choice, load_params
from tasks.params.schema import FINETUNE_STAGES, PipelineParams
from tasks.stages.finetune import finetune_section
from tasks.tracking import PipelineRecorder
from tasks.tracking.models.registry import registered_name, settle_champion

COMPARISON_FILE = "finetune_comparison.json"


@flow(
    name="finetune-method",
    log_prints=False,
    persist_result=False,
    validate_parameters=True,
    on_failure=[record_failure],
    on_crashed=[record_failure],
)
def finetune_method(
    params_path: str,
    overrides: list[str] | None = None,
    until: str = FINETUNE_STAGES[-1],
    trial: dict | None = None,
) -> dict:
    """One method's fine-tune of the parameter file's base model on its corpus, redoing only what
    changed; under `finetune` its MLflow run is a child of the comparison's (`trial`)."""
    hide_user_error_tracebacks()
    choice("--until", until, FINETUNE_STAGES)
    params = finetune_params(params_path, list(overrides or []))
    title = f"gptpipe fine-tune {params.finetune.name} ({params.finetune.method}): {Path(params_path).name}"
    report = PipelineReport(until, title, FINETUNE_STAGES, params_path=params_path)
    tracking = PipelineRecorder.start(params, Path(params_path), str(flow_run.get_id() or ""), trial=trial)
    report.links.update(tracking.links())
    try:
        base = report.stage("base", lambda: stages.base(params, tracking))
        tuned = stages.with_base(params, base)  # training starts from the base's weights
        lineage = lineage_tags(tuned, base)
        tracking.log_params(lineage)  # the run compares by them too: method, rank, base version
        tokens = report.stage(
            "tokens", lambda: stages.tokens(tuned, base.result.tokenizer_result(), tracking)
        )
        device = report.stage("device", lambda: stages.device(tuned, tracking))
        smoke = report.stage("smoke", lambda: stages.smoke(tuned, tokens, device, tracking))
        trained = report.stage(
            "finetune", lambda: stages.full(tuned, tokens, device, smoke, tracking, name="finetune")
        )
        merged = report.stage("merge", lambda: stages.merge(tuned, trained, tracking))
        evaluate = report.stage(
            "evaluate", lambda: stages.evaluate(tuned, tokens, device, merged, tracking, lineage)
        )
        report.stage(
            "before-after",
            lambda: stages.before_after(tuned, tokens, device, merged, evaluate, base, tracking),
        )
    finally:
        report.close(tracking, key=f"gptpipe-finetune-{params.finetune.name}-{params.finetune.method}")
    return report.to_dict()


@flow(name="finetune", log_prints=False, validate_parameters=True, persist_result=False)
def finetune(params_path: str, overrides: list[str] | None = None) -> dict:
    """Each method the parameter file asks for (`finetune.method`, and the others with `compare`) on the
    same data and steps, as child runs of one comparison run; their table printed and recorded."""
    hide_user_error_tracebacks()
    overrides = list(overrides or [])
    params = finetune_params(params_path, overrides)
    methods = params.finetune.methods()
    if len(methods) == 1:
        return {"methods": {methods[0]: finetune_method(params_path, overrides)}}
    session, parent = _open_comparison_run(params, methods)
    results = [MethodResult(method) for method in methods]
    try:
        for result in results:
            trial = {"parent_run_id": parent, "name": result.method, "kind": "finetune-method"}
            try:
                result.report = finetune_method(
                    params_path, [*overrides, f"finetune.method={result.method}"], trial=trial
                )
            except Exception as error:  # the other method still runs: the table says which failed
                result.message = first_line(error, 300)
    finally:
        done = all(result.completed for result in results)
        champion = _champion_version(session, registered_name(params))
        rows = [{**result.row(), "champion": result.row()["model_version"] == champion} for result in results]
        title = f"Fine-tune {params.finetune.name}: {' against '.join(methods)}"
        where = TableRun(session, parent, title, COMPARISON_FILE, f"gptpipe-finetune-{params.finetune.name}")
        where.publish(rows, comparison_table(rows), done, f"{' against '.join(methods)}, same data and steps")
    summary: dict[str, Any] = {"comparison_run_id": parent, "methods": {r.method: r.row() for r in results}}
    if not done:
        summary["failed"] = [result.method for result in results if not result.completed]
    return summary


def finetune_params(params_path: str, overrides: list[str]) -> PipelineParams:
    """The parameter file, which must be a fine-tune's (a `finetune` section)."""
    params = load_params(params_path, overrides)
    finetune_section(params, params_path)
    return params


def lineage_tags(params: PipelineParams, base: Any) -> dict[str, str]:
    """What a fine-tuned version's tags say of where it came from: the base (URI, registered name and
    version, its weights' sha256) and how it was adapted."""
    tune = params.finetune
    tags = dict(stages.lineage_of(base) or {})
    tags["finetune.name"], tags["finetune.method"] = tune.name, tune.method
    adapters = tune.adapters()  # LoRA's and QLoRA's settings (QLoRA's with lora.quantized_base)
    if adapters is not None:
        tags.update({f"lora.{key}": str(value) for key, value in adapters.model_dump().items()})
    return tags


# --- the comparison ---------------------------------------------------------------------------------

# The table's columns: (header, stage, figure) for each method's report.
COLUMNS = (
    ("trainable parameters", "finetune", "trainable_parameter_count"),
    ("trainable share", "finetune", "trainable_parameter_share"),
    ("optimizer state bytes", "finetune", "optimizer_state_bytes"),
    ("training peak memory bytes", "finetune", "training_peak_memory_bytes"),
    ("tokens/s", "finetune", "tokens_per_second"),
    ("new test bits/byte before", "before-after", "new_test_bits_per_byte_before"),
    ("new test bits/byte after", "before-after", "new_test_bits_per_byte_after"),
    ("base test bits/byte before", "before-after", "base_test_bits_per_byte_before"),
    ("base test bits/byte after", "before-after", "base_test_bits_per_byte_after"),
    ("model version", "evaluate", "model_version"),
)


@dataclass
class MethodResult:
    method: str
    report: dict[str, Any] = field(default_factory=dict)
    message: str = ""

    @property
    def completed(self) -> bool:
        stages = self.report.get("stages", [])
        return (
            bool(stages) and not self.message and all(s["state"] in ("completed", "cached") for s in stages)
        )

    def figure(self, stage: str, name: str) -> Any:
        found = next((s for s in self.report.get("stages", []) if s["name"] == stage), {})
        return found.get("figures", {}).get(name)

    def row(self) -> dict[str, Any]:
        """The method's figures, named as MLflow names them."""
        row: dict[str, Any] = {"method": self.method}
        row.update({name: self.figure(stage, name) for _, stage, name in COLUMNS})
        row["state"] = "completed" if self.completed else f"failed: {self.message or 'see its run'}"
        return row


def comparison_table(rows: list[dict[str, Any]]) -> str:
    headers = ["method", *(header for header, _, _ in COLUMNS), "@champion", "state"]
    cells = [
        [
            row["method"],
            *(cell(row[name]) for _, _, name in COLUMNS),
            "yes" if row["champion"] else "",
            row["state"],
        ]
        for row in rows
    ]
    return table(headers, cells)


def _champion_version(session: Any, name: str) -> str | None:
    """The version `@champion` names once both methods registered theirs, settled first (a method's
    process killed right after a stale set is put right: `settle_champion`; None: none, or no answer)."""
    try:
        return settle_champion(session.client, name)
    except Exception:  # no champion yet (both failed), or the store is away: the column stays empty
        return None


def _open_comparison_run(params: PipelineParams, methods: list[str]) -> tuple[Any, str | None]:
    """The MLflow run the methods' runs are children of."""
    from tasks.tracking import TrackingSession

    session = TrackingSession.open(params.tracking)
    tune = params.finetune
    run = session.client.create_run(
        session.experiment_id,
        run_name=f"finetune-{tune.name}-{'-vs-'.join(methods)}",
        tags={"kind": "finetune", "finetune.name": tune.name, "base_model_uri": tune.model},
    )
    return session, run.info.run_id
