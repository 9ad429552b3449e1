"""The end-to-end flow: tokenizer → token files → device check → smoke training → full training →
held-out evaluation → exports → quantization. With `full.init_from` the tokenizer stage takes that
model's tokenizer and training starts from its weights: continued pretraining.

Each stage is one object of `tasks/stages/` (its inputs, cache key, Prefect task, result and record); this
flow composes them, handing each the typed results and values (the start model) of those before it, and
publishes the run's summary (a markdown artifact and one final JSON line on stdout).
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.runtime import flow_run

from flows.environment.prefect_settings import hide_user_error_tracebacks
from flows.failure_hooks import record_failure
from flows.report import PipelineReport
from gptcore.tools.records import JSONObject
from tasks.params.jobs import TrainingStart
from tasks.params.loading import choice, load_params
from tasks.params.schema import STAGES
from tasks.stages.base import Base
from tasks.stages.device import Device
from tasks.stages.evaluate import Evaluate
from tasks.stages.export import Export
from tasks.stages.full import Full
from tasks.stages.quantize import Quantize
from tasks.stages.smoke import Smoke
from tasks.stages.tokenizer import Tokenizer
from tasks.stages.tokens import Tokens
from tasks.tracking import PipelineRecorder

DEFAULT_PARAMS = "params/iteration_1.yaml"


@flow(
    name="end-to-end",
    log_prints=False,
    persist_result=False,  # its report is returned in this process: Prefect would keep it as a pickle
    validate_parameters=True,
    on_failure=[record_failure],  # which stage, why, the latest checkpoint, the command that resumes
    on_crashed=[record_failure],
)
def end_to_end(
    params_path: str = DEFAULT_PARAMS,
    overrides: list[str] | None = None,
    until: str = STAGES[-1],
    trial: dict | None = None,
) -> JSONObject:
    """Corpus to trained checkpoint for one parameter file, redoing only what changed. A sweep passes its
    `trial` ({"parent_run_id", "name", "values"}): the MLflow run is then the trial's, under the sweep's."""
    hide_user_error_tracebacks()
    choice("--until", until, STAGES)
    params = load_params(params_path, list(overrides or []))
    title = f"gptpipe iteration {params.iteration}: {Path(params_path).name}"
    report = PipelineReport(until, title, params_path=params_path)
    flow_run_id = str(flow_run.get_id() or "")
    tracking = PipelineRecorder.start(params, Path(params_path), flow_run_id=flow_run_id, trial=trial)
    report.links.update(tracking.links())
    try:
        if params.full.init_from is None:
            tokenizer = report.run(Tokenizer(params=params), tracking).result
            start, lineage = TrainingStart.scratch(params), None
        else:  # continued pretraining: the model's tokenizer encodes the corpus, training starts from it
            base = report.run(Base(params=params, name="tokenizer"), tracking).result
            tokenizer, start, lineage = base.tokenizer_result(), base.start(), base.lineage_tags()
        tokens = report.run(Tokens(params=params, tokenizer=tokenizer), tracking).result
        device = report.run(Device(params=params, start=start), tracking).result
        smoke = report.run(Smoke(params=params, start=start, tokens=tokens, device=device), tracking).result
        full = report.run(
            Full(params=params, start=start, tokens=tokens, device=device, smoke=smoke), tracking
        ).result
        evaluated = report.run(
            Evaluate(params=params, tokens=tokens, device=device, trained=full, lineage=lineage), tracking
        ).result
        report.run(Export(params=params, tokens=tokens, trained=full, evaluated=evaluated), tracking)
        report.run(
            Quantize(params=params, tokens=tokens, device=device, trained=full, evaluated=evaluated), tracking
        )
    finally:
        report.close(tracking, key=f"gptpipe-iteration-{params.iteration}-summary")
    return report.to_dict()
