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

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from prefect import flow
from prefect.runtime import flow_run

from flows.environment.prefect_settings import hide_user_error_tracebacks
from flows.failure_hooks import record_failure
from flows.report import PipelineReport
from flows.run_report import RunReport
from flows.trials import TableRun
from gptcore.errors import first_line
from gptcore.tools.markdown import cell, table
from gptcore.tools.records import JSONObject
from tasks.params.loading import choice, load_params
from tasks.params.schema import FINETUNE_STAGES, PipelineParams
from tasks.results import Figure
from tasks.stages.base import Base
from tasks.stages.before_after import BeforeAfter
from tasks.stages.chat_tokens import ChatTokens
from tasks.stages.device import Device
from tasks.stages.evaluate import Evaluate
from tasks.stages.finetune import finetune_section
from tasks.stages.full import Full
from tasks.stages.merge import Merge
from tasks.stages.smoke import Smoke
from tasks.stages.start_model import BaseResult
from tasks.stages.tokens import Tokens
from tasks.tracking import ParentRun, PipelineRecorder, TrackingSession
from tasks.tracking.models.registry import champion_of, registered_name

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
) -> JSONObject:
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
        base = report.run(Base(params=params), tracking).result
        start, lineage = base.start(), lineage_tags(params, base)  # training starts from the base's weights
        tracking.log_params(lineage)  # the run compares by them too: method, rank, base version
        tokens = report.run(tokens_stage(params, base), tracking).result
        device = report.run(Device(params=params, start=start), tracking).result
        smoke = report.run(Smoke(params=params, start=start, tokens=tokens, device=device), tracking).result
        tuned = report.run(
            Full(params=params, name="finetune", start=start, tokens=tokens, device=device, smoke=smoke),
            tracking,
        ).result
        merged = report.run(Merge(params=params, trained=tuned), tracking).result
        evaluated = report.run(
            Evaluate(params=params, tokens=tokens, device=device, trained=merged, lineage=lineage), tracking
        ).result
        report.run(
            BeforeAfter(
                params=params, tokens=tokens, device=device, trained=merged, evaluated=evaluated, base=base
            ),
            tracking,
        )
    finally:
        report.close(tracking, key=f"gptpipe-finetune-{params.finetune.name}-{params.finetune.method}")
    return report.to_dict()


@flow(name="finetune", log_prints=False, validate_parameters=True, persist_result=False)
def finetune(params_path: str, overrides: list[str] | None = None) -> JSONObject:
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
                result.report = RunReport.model_validate(
                    finetune_method(
                        params_path, [*overrides, f"finetune.method={result.method}"], trial=trial
                    )
                )
            except Exception as error:  # the other method still runs: the table says which failed
                result.message = first_line(error, 300)
    finally:
        done = all(result.completed for result in results)
        champion = _champion_version(session, registered_name(params))
        rows = [result.row().holding(champion) for result in results]
        title = f"Fine-tune {params.finetune.name}: {' against '.join(methods)}"
        where = TableRun(session, parent, title, COMPARISON_FILE, f"gptpipe-finetune-{params.finetune.name}")
        described = f"{' against '.join(methods)}, same data and steps"
        where.publish([row.to_dict() for row in rows], comparison_table(rows), done, described)
    methods_rows: JSONObject = {result.method: result.row().to_dict() for result in results}
    summary: JSONObject = {"comparison_run_id": parent, "methods": methods_rows}
    if not done:
        summary["failed"] = [result.method for result in results if not result.completed]
    return summary


def tokens_stage(params: PipelineParams, base: BaseResult) -> Tokens | ChatTokens:
    """The new text's token files (documents), or a chat fine-tune's conversations in the template."""
    tokenizer = base.tokenizer_result()
    if finetune_section(params).chat:
        return ChatTokens(params=params, tokenizer=tokenizer, block_size=base.model.architecture.block_size)
    return Tokens(params=params, tokenizer=tokenizer)


def finetune_params(params_path: str, overrides: list[str]) -> PipelineParams:
    """The parameter file, which must be a fine-tune's (a `finetune` section)."""
    params = load_params(params_path, overrides)
    finetune_section(params, params_path)
    return params


def lineage_tags(params: PipelineParams, base: BaseResult) -> dict[str, str]:
    """What a fine-tuned version's tags say of where it came from: the base (URI, registered name and
    version, its weights' sha256) and how it was adapted."""
    tune = finetune_section(params)
    tags = base.lineage_tags()
    tags["finetune.name"], tags["finetune.method"] = tune.name, tune.method
    tags["finetune.format"] = tune.format  # chat: answers in the template; its test split is chat's own
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


@dataclass(frozen=True)
class MethodRow:
    """A method's line of the comparison: its figures under the names MLflow gives them (`COLUMNS`), its
    state, and whether it holds `@champion` (None: not asked, as in the flow's summary)."""

    method: str
    trainable_parameter_count: Figure
    trainable_parameter_share: Figure
    optimizer_state_bytes: Figure
    training_peak_memory_bytes: Figure
    tokens_per_second: Figure
    new_test_bits_per_byte_before: Figure
    new_test_bits_per_byte_after: Figure
    base_test_bits_per_byte_before: Figure
    base_test_bits_per_byte_after: Figure
    model_version: Figure
    state: str
    champion: bool | None = None

    def holding(self, champion: str | None) -> MethodRow:
        """The row saying whether its version is `champion`, the version `@champion` names."""
        return replace(self, champion=self.model_version == champion)

    def to_dict(self) -> JSONObject:
        """The row as MLflow's table and the flow's JSON take it (no `champion` where it was not asked)."""
        row: JSONObject = asdict(self)
        if self.champion is None:
            del row["champion"]
        return row


@dataclass
class MethodResult:
    method: str
    report: RunReport = field(default_factory=lambda: RunReport(stages=[]))
    message: str = ""

    @property
    def completed(self) -> bool:
        stages = self.report.stages
        return bool(stages) and not self.message and all(stage.done for stage in stages)

    def figure(self, stage: str, name: str) -> Figure:
        return self.report.figure(stage, name)

    def row(self) -> MethodRow:
        """The method's figures, named as MLflow names them."""
        state = "completed" if self.completed else f"failed: {self.message or 'see its run'}"
        figures = {name: self.figure(stage, name) for _, stage, name in COLUMNS}
        return MethodRow(method=self.method, **figures, state=state)


def comparison_table(rows: list[MethodRow]) -> str:
    headers = ["method", *(header for header, _, _ in COLUMNS), "@champion", "state"]
    cells = [
        [
            row.method,
            *(cell(getattr(row, name)) for _, _, name in COLUMNS),
            "yes" if row.champion else "",
            row.state,
        ]
        for row in rows
    ]
    return table(headers, cells)


def _champion_version(session: TrackingSession, name: str) -> str | None:
    """The version `@champion` names once both methods registered theirs, settled first (a method's
    process killed right after a stale set is put right: `settle_champion`; None: none, or no answer)."""
    try:
        return champion_of(session, name)
    except Exception:  # no champion yet (both failed), or the store is away: the column stays empty
        return None


def _open_comparison_run(params: PipelineParams, methods: list[str]) -> tuple[TrackingSession, str]:
    """The MLflow run the methods' runs are children of: its session, and its id."""
    tune = params.finetune
    run = ParentRun.open(
        params.tracking,
        f"finetune-{tune.name}-{'-vs-'.join(methods)}",
        {"kind": "finetune", "finetune.name": tune.name, "base_model_uri": tune.model},
    )
    return run.session, run.run_id
