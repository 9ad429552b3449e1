"""The end-to-end flow: tokenizer → token files → device check → smoke training → full training →
held-out evaluation → exports → quantization. With `full.init_from` the tokenizer stage takes that
model's tokenizer and training starts from its weights: continued pretraining.

Each stage is a cached Prefect task in `tasks/`; this flow only composes them, records each stage's
state, and publishes the run's summary (a markdown artifact and one final JSON line on stdout).
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.runtime import flow_run

from flows.environment.prefect_settings import hide_user_error_tracebacks
from flows.failure_hooks import record_failure
from flows.report import PipelineReport
from tasks import pipeline as stages
from tasks.params.loading import choice, load_params
from tasks.params.schema import STAGES
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
) -> dict:
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
        tokenizer = report.stage("tokenizer", lambda: stages.tokenizer(params, tracking))
        started = stages.with_base(params, tokenizer)  # full.init_from: training starts from its weights
        lineage = stages.lineage_of(tokenizer)
        tokens = report.stage(
            "tokens", lambda: stages.tokens(started, stages.tokenizer_of(tokenizer), tracking)
        )
        device = report.stage("device", lambda: stages.device(started, tracking))
        smoke = report.stage("smoke", lambda: stages.smoke(started, tokens, device, tracking))
        full = report.stage("full", lambda: stages.full(started, tokens, device, smoke, tracking))
        evaluate = report.stage(
            "evaluate", lambda: stages.evaluate(started, tokens, device, full, tracking, lineage)
        )
        report.stage("export", lambda: stages.export(started, tokens, full, evaluate, tracking))
        report.stage("quantize", lambda: stages.quantize(started, tokens, device, full, evaluate, tracking))
    finally:
        report.close(tracking, key=f"gptpipe-iteration-{params.iteration}-summary")
    return report.to_dict()
