"""The pipeline's stages as the flow calls them: fingerprint, cached task, outputs checked, recorded.

Each function computes the stage's fingerprint from what determines its output, runs the cached task
through `run_cached` (which reruns a hit whose files are missing or changed) and records the stage in
MLflow. Only the device check runs every time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptcore.eval.benchmarks import BenchmarkScores
from tasks.caching import StageOutcome, run_cached
from tasks.params.schema import PipelineParams
from tasks.results import (
    BaseResult,
    BeforeAfterResult,
    EvaluateResult,
    ExportResult,
    FullResult,
    MergeResult,
    QuantizeResult,
    SmokeResult,
    TokenizerResult,
    TokensResult,
)
from tasks.stages import data as data_stages
from tasks.stages import evaluate as evaluate_stage
from tasks.stages import export as export_stage
from tasks.stages import finetune as finetune_stage
from tasks.stages import quantize as quantize_stage
from tasks.stages import start_model
from tasks.stages import training as training_stages
from tasks.stages.device import device_task
from tasks.tracking import PipelineRecorder
from tasks.tracking.models.registry import registered_name
from tasks.tracking.models.test_split import split_tags


def data_root(params: PipelineParams) -> str:
    return str(Path(params.paths.data_root).resolve())


def tokenizer(params: PipelineParams, tracking: PipelineRecorder) -> StageOutcome:
    """The tokenizer trained on the corpus; with `full.init_from`, that model's instead (`base`)."""
    if params.full.init_from is not None:
        return base(params, tracking, name="tokenizer")
    corpus_fp, fingerprint = data_stages.tokenizer_stage_fingerprint(
        params.corpus, params.tokenizer, Path(data_root(params))
    )
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


def tokens(params: PipelineParams, tokenizer: TokenizerResult, tracking: PipelineRecorder) -> StageOutcome:
    """The corpus as token files, encoded with `tokenizer` (the tokenizer stage's, a fine-tune's base's)."""
    outcome = run_cached(
        "tokens",
        data_stages.tokens_task,
        TokensResult,
        fingerprint=data_stages.tokens_stage_fingerprint(tokenizer, params.data),
        corpus=params.corpus,
        data=params.data,
        tokenizer_result=tokenizer,
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
    name: str = "full",
) -> StageOutcome:
    """Full training (`name`: `finetune` for a fine-tune's, which starts from its base)."""
    refusal = params.full_refusal(device.result.runtime.device)
    if refusal:
        outcome = StageOutcome(name, "skipped", message=refusal)
        training_stages.announce(refusal)
        tracking.record_stage(outcome)
        return outcome
    fingerprint = training_stages.full_fingerprint(params, tokens.result, device.result, smoke.result)
    outcome = run_cached(
        name,
        training_stages.full_task,
        FullResult,
        fingerprint=fingerprint,
        params=params,
        tokens=tokens.result,
        device=device.result,
        smoke=smoke.result,
        run_context=tracking.context(name),
    )
    tracking.record_stage(outcome)
    return outcome


def merge(params: PipelineParams, full: StageOutcome, tracking: PipelineRecorder) -> StageOutcome:
    """A fine-tune's checkpoints as plain models (LoRA's merged, logged as models of the stage's run)."""
    fingerprint = finetune_stage.merge_fingerprint(params, full.result)
    task = finetune_stage.merge_task
    outcome = run_cached("merge", task, MergeResult, fingerprint=fingerprint, params=params, full=full.result)
    if outcome.state == "completed" and outcome.result.merged:
        tracking.log_models("merge", [Path(path) for path in outcome.result.checkpoints])
    tracking.record_stage(outcome)
    return outcome


@dataclass(frozen=True)
class ReadCheckpoint:
    """What the stages after training share: the checkpoint they read, its digest (part of their cache
    key, so a retrained checkpoint misses), and the device they run on (None: one that needs none)."""

    checkpoint: Path
    digest: str
    device: str | None = None

    @classmethod
    def of(cls, full: StageOutcome, checkpoint: Path, device: StageOutcome | None = None) -> ReadCheckpoint:
        digest = evaluate_stage.checkpoint_digest(full.result, checkpoint)
        return cls(checkpoint, digest, device.result.runtime.device if device is not None else None)

    def run(
        self, name: str, stage_task: Any, result_type: type, fingerprint: str, params: PipelineParams,
        tokens: StageOutcome, **more: Any,
    ) -> StageOutcome:  # fmt: skip
        """The stage through the cache, on this checkpoint (and device, when it has one)."""
        on_device = {} if self.device is None else {"device": self.device}
        arguments = dict(
            params=params, tokens=tokens.result, checkpoint=str(self.checkpoint), **on_device, **more
        )
        return run_cached(name, stage_task, result_type, fingerprint=fingerprint, **arguments)


def evaluate(
    params: PipelineParams,
    tokens: StageOutcome,
    device: StageOutcome,
    full: StageOutcome,
    tracking: PipelineRecorder,
    lineage: dict[str, str] | None = None,
) -> StageOutcome:
    """The held-out evaluation, and the model registered (a fine-tune's with its `lineage` as tags)."""
    checkpoint = evaluate_stage.evaluated_checkpoint(params, full.result)
    read = ReadCheckpoint.of(full, checkpoint, device)
    fingerprint = evaluate_stage.evaluate_fingerprint(params, tokens.result, read.digest, read.device)
    outcome = read.run("evaluate", evaluate_stage.evaluate_task, EvaluateResult, fingerprint, params, tokens)
    bits = outcome.figures.get("test_bits_per_byte")
    if bits is not None:
        name = registered_name(params)
        gate = evaluate_stage.benchmark_gate(params, outcome.result)
        benchmarks = BenchmarkScores.from_dict(outcome.result.benchmarks).figures()
        split = split_tags(tokens.result.test)
        registration = tracking.register_evaluated(
            name, checkpoint, read.digest, bits, lineage, benchmarks, gate, split
        )
        if registration is not None:
            if registration.not_compared:
                training_stages.announce(
                    f"evaluate: {name} version {registration.model_version}: {registration.not_compared}"
                )
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
    read = ReadCheckpoint.of(full, Path(evaluate.result.checkpoint))
    fingerprint = export_stage.export_fingerprint(read.digest)
    outcome = read.run("export", export_stage.export_task, ExportResult, fingerprint, params, tokens)
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
    read = ReadCheckpoint.of(full, Path(evaluate.result.checkpoint), device)
    fingerprint = quantize_stage.quantize_fingerprint(params, tokens.result, read.digest, read.device)
    outcome = read.run("quantize", quantize_stage.quantize_task, QuantizeResult, fingerprint, params, tokens)
    if outcome.result is not None:
        registrations = tracking.record_quantized(
            registered_name(params), outcome.result, read.digest, params.quantize.may_hold_champion,
            split_tags(tokens.result.test),
        )  # fmt: skip
        figures = dict(outcome.figures)
        for method, registration in registrations.items():
            if registration is not None:
                figures[f"{method}/model_version"] = registration.model_version
                figures[f"{method}/alias"] = registration.alias
        outcome.result = outcome.result.model_copy(update={"figures": figures})
    tracking.record_stage(outcome)
    return outcome


def base(params: PipelineParams, tracking: PipelineRecorder, name: str = "base") -> StageOutcome:
    """The model training starts from, resolved and checked (every time: an alias may have moved): a
    fine-tune's base, or (as the `tokenizer` stage) a continued pretraining's `full.init_from`."""
    started = time.perf_counter()
    if params.finetune is not None:
        result = finetune_stage.resolve_base(params)
    else:
        result = start_model.resolve_start(params, start_model.start_model(params))
        training_stages.announce(
            f"{name}: {result.uri}'s tokenizer encodes the corpus; training starts from its weights"
        )
    outcome = StageOutcome(name, "completed", result, round(time.perf_counter() - started, 3))
    tracking.record_stage(outcome)
    resolved = start_model.started_from(params, result)
    if params.model is None:  # the file named none: the start model's own, as its files say it
        tracking.log_params(resolved.model_params())
    tracking.params = resolved  # the training stages' runs record the model they build
    return outcome


def with_base(params: PipelineParams, base: StageOutcome) -> PipelineParams:
    """The parameters with the start model as what training builds and loads, its architecture and kept
    files (a BaseResult's; another stage's result, a trained tokenizer's: unchanged)."""
    if not isinstance(base.result, BaseResult):
        return params
    return start_model.started_from(params, base.result)


def lineage_of(stage: StageOutcome) -> dict[str, str] | None:
    """What a version trained from a start model says of it in its tags: the model (URI, registered name
    and version or source, its weights' sha256); None for a run from random weights."""
    result = stage.result
    if not isinstance(result, BaseResult):
        return None
    return {**result.lineage, "base_weights_sha256": result.weights_sha256}


def tokenizer_of(stage: StageOutcome) -> TokenizerResult:
    """The tokenizer the tokens stage encodes with: trained by the stage, or the start model's."""
    result = stage.result
    return result.tokenizer_result() if isinstance(result, BaseResult) else result


def before_after(
    params: PipelineParams,
    tokens: StageOutcome,
    device: StageOutcome,
    tuned: StageOutcome,
    evaluate: StageOutcome,
    base: StageOutcome,
    tracking: PipelineRecorder,
) -> StageOutcome:
    read = ReadCheckpoint.of(tuned, Path(evaluate.result.checkpoint), device)
    fingerprint = finetune_stage.before_after_fingerprint(
        params, base.result, tokens.result, read.digest, read.device
    )
    outcome = read.run(
        "before-after", finetune_stage.before_after_task, BeforeAfterResult, fingerprint, params, tokens,
        base=base.result,
    )  # fmt: skip
    tracking.record_stage(outcome)
    return outcome


def _skipped(name: str, reason: str, tracking: PipelineRecorder) -> StageOutcome:
    """A stage the parameter file turns off: skipped with the reason, recorded as such."""
    outcome = StageOutcome(name, "skipped", message=reason)
    tracking.record_stage(outcome)
    return outcome
