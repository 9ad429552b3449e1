"""The pipeline's stages as the flow calls them: fingerprint, cached task, outputs checked, recorded.

Each function computes the stage's fingerprint from what determines its output, runs the cached task
through `run_cached` (which reruns a hit whose files are missing or changed) and records the stage in
MLflow. Only the device check runs every time.
"""

from __future__ import annotations

import time
from pathlib import Path

from gptcore.config import PipelineParams
from tasks.caching import StageOutcome, run_cached
from tasks.results import (
    EvaluateResult,
    ExportResult,
    FullResult,
    QuantizeResult,
    SmokeResult,
    TokenizerResult,
    TokensResult,
)
from tasks.stages import data as data_stages
from tasks.stages import evaluate as evaluate_stage
from tasks.stages import export as export_stage
from tasks.stages import quantize as quantize_stage
from tasks.stages import training as training_stages
from tasks.stages.device import device_task
from tasks.tracking import PipelineRecorder
from tasks.tracking.models.registry import registered_name


def data_root(params: PipelineParams) -> str:
    return str(Path(params.paths.data_root).resolve())


def tokenizer(params: PipelineParams, tracking: PipelineRecorder) -> StageOutcome:
    corpus_fp, fingerprint = data_stages.tokenizer_stage_fingerprint(params.corpus, params.tokenizer)
    outcome = run_cached(
        "tokenizer",
        data_stages.tokenizer_task,
        TokenizerResult,
        fingerprint=fingerprint,
        corpus=params.corpus,
        tokenizer=params.tokenizer,
        data_root=data_root(params),
        corpus_fp=corpus_fp,
    )
    tracking.record_stage(outcome)
    return outcome


def tokens(params: PipelineParams, tokenizer: StageOutcome, tracking: PipelineRecorder) -> StageOutcome:
    outcome = run_cached(
        "tokens",
        data_stages.tokens_task,
        TokensResult,
        fingerprint=data_stages.tokens_stage_fingerprint(tokenizer.result),
        corpus=params.corpus,
        tokenizer_result=tokenizer.result,
        data_root=data_root(params),
    )
    tracking.record_stage(outcome)
    return outcome


def device(params: PipelineParams, tracking: PipelineRecorder) -> StageOutcome:
    started = time.perf_counter()
    result = device_task(params)
    outcome = StageOutcome("device", "completed", result, round(time.perf_counter() - started, 3))
    tracking.record_stage(outcome)
    return outcome


def smoke(
    params: PipelineParams, tokens: StageOutcome, device: StageOutcome, tracking: PipelineRecorder
) -> StageOutcome:
    fingerprint = training_stages.smoke_fingerprint(params, tokens.result, device.result)
    outcome = run_cached(
        "smoke",
        training_stages.smoke_task,
        SmokeResult,
        fingerprint=fingerprint,
        params=params,
        tokens=tokens.result,
        device=device.result,
        run_context=tracking.context("smoke"),
    )
    tracking.record_stage(outcome)
    training_stages.announce_smoke(outcome.figures)
    return outcome


def full(
    params: PipelineParams,
    tokens: StageOutcome,
    device: StageOutcome,
    smoke: StageOutcome,
    tracking: PipelineRecorder,
) -> StageOutcome:
    refusal = training_stages.full_refusal(params, device.result)
    if refusal:
        outcome = StageOutcome("full", "skipped", message=refusal)
        training_stages.announce(refusal)
        tracking.record_stage(outcome)
        return outcome
    fingerprint = training_stages.full_fingerprint(params, tokens.result, device.result, smoke.result)
    outcome = run_cached(
        "full",
        training_stages.full_task,
        FullResult,
        fingerprint=fingerprint,
        params=params,
        tokens=tokens.result,
        device=device.result,
        smoke=smoke.result,
        run_context=tracking.context("full"),
    )
    tracking.record_stage(outcome)
    return outcome


def evaluate(
    params: PipelineParams,
    tokens: StageOutcome,
    device: StageOutcome,
    full: StageOutcome,
    tracking: PipelineRecorder,
) -> StageOutcome:
    checkpoint = evaluate_stage.evaluated_checkpoint(params, full.result)
    digest = evaluate_stage.checkpoint_digest(full.result, checkpoint)
    where = device.result.runtime["device"]
    outcome = run_cached(
        "evaluate",
        evaluate_stage.evaluate_task,
        EvaluateResult,
        fingerprint=evaluate_stage.evaluate_fingerprint(params, tokens.result, digest, where),
        params=params,
        tokens=tokens.result,
        checkpoint=str(checkpoint),
        device=where,
    )
    bits = outcome.figures.get("test_bits_per_byte")
    if bits is not None:
        registration = tracking.register_evaluated(registered_name(params), checkpoint, digest, bits)
        if registration is not None:
            figures = {**outcome.figures, **registration.figures()}
            outcome.result = outcome.result.model_copy(update={"figures": figures})
    tracking.record_stage(outcome)
    return outcome


def export(
    params: PipelineParams,
    tokens: StageOutcome,
    full: StageOutcome,
    evaluate: StageOutcome,
    tracking: PipelineRecorder,
) -> StageOutcome:
    if not params.export.hf:
        return _skipped("export", "export.hf is off in the parameter file", tracking)
    checkpoint = Path(evaluate.result.checkpoint)
    digest = evaluate_stage.checkpoint_digest(full.result, checkpoint)
    outcome = run_cached(
        "export",
        export_stage.export_task,
        ExportResult,
        fingerprint=export_stage.export_fingerprint(digest),
        params=params,
        tokens=tokens.result,
        checkpoint=str(checkpoint),
    )
    tracking.record_stage(outcome)
    return outcome


def quantize(
    params: PipelineParams,
    tokens: StageOutcome,
    device: StageOutcome,
    full: StageOutcome,
    evaluate: StageOutcome,
    tracking: PipelineRecorder,
) -> StageOutcome:
    if not params.quantize.methods:
        return _skipped("quantize", "quantize.methods is empty in the parameter file", tracking)
    checkpoint = Path(evaluate.result.checkpoint)
    digest = evaluate_stage.checkpoint_digest(full.result, checkpoint)
    where = device.result.runtime["device"]
    outcome = run_cached(
        "quantize",
        quantize_stage.quantize_task,
        QuantizeResult,
        fingerprint=quantize_stage.quantize_fingerprint(params, tokens.result, digest, where),
        params=params,
        tokens=tokens.result,
        checkpoint=str(checkpoint),
        device=where,
    )
    if outcome.result is not None:
        registrations = tracking.record_quantized(
            registered_name(params), outcome.result, digest, params.quantize.may_hold_champion
        )
        figures = dict(outcome.figures)
        for method, registration in registrations.items():
            if registration is not None:
                figures[f"{method}/model_version"] = registration.model_version
                figures[f"{method}/alias"] = registration.alias
        outcome.result = outcome.result.model_copy(update={"figures": figures})
    tracking.record_stage(outcome)
    return outcome


def _skipped(name: str, reason: str, tracking: PipelineRecorder) -> StageOutcome:
    """A stage the parameter file turns off: skipped with the reason, recorded as such."""
    outcome = StageOutcome(name, "skipped", message=reason)
    tracking.record_stage(outcome)
    return outcome
