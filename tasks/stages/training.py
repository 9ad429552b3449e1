"""Smoke and full training as cached Prefect tasks over `gptcore.train.trainer`.

Both are keyed on the token files' fingerprint, the model, the resolved runtime, the stage's training
settings and the code version. Full training writes into a run folder named by that fingerprint, so a
rerun after a failure finds its checkpoints there and resumes from the latest one, not from step 0.
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gptcore.data.batches import examples_in
from gptcore.errors import TrainingError
from gptcore.runtime.batch_size import BatchChoice
from gptcore.tools.atomic import write_json_atomic
from gptcore.tools.fingerprint import code_version_of, fingerprint
from gptcore.train.config import TrainingConfig
from gptcore.train.estimate import RunPlan, estimate_run
from gptcore.train.records import StartupRecord, SummaryRecord
from tasks.caching import stage_task
from tasks.params.jobs import full_world_size
from tasks.params.schema import PipelineParams, TrainingStage
from tasks.prefect_progress import PrefectProgress
from tasks.results import DeviceResult, FullResult, SmokeResult, TokensResult, file_record
from tasks.stages.smoke_gate import DataSizing, judge, memory_limit

SMOKE_RECORD = "smoke.json"
# Runtime fields that change what training computes (threads and pinning do not).
_RUNTIME_KEYS = (
    "device",
    "precision",
    "batch_size",
    "grad_accum_steps",
    "batch_size_source",
    "effective_batch_target",
    "activation_checkpointing",
    "compile",
)


def announce(message: str) -> None:
    """A line for the person at the terminal (stderr: stdout ends with the JSON record)."""
    print(message, file=sys.stderr, flush=True)


def _training_code_version() -> str:
    """The modules whose code decides what training produces; an edit elsewhere in gptcore (data stages,
    tracking, the CLI) keeps finished training cached and a killed run resumable."""
    import gptcore.checkpoint.manager
    import gptcore.data.batches
    import gptcore.distributed.group
    import gptcore.model.cross_entropy
    import gptcore.model.gpt
    import gptcore.runtime.batch_size
    import gptcore.runtime.memory
    import gptcore.train.job
    import gptcore.train.schedule
    import gptcore.train.setup
    import gptcore.train.step
    import gptcore.train.trainer
    import gptcore.train.validate

    return code_version_of(
        gptcore.model.gpt,
        gptcore.model.cross_entropy,
        gptcore.train.trainer,
        gptcore.train.step,  # how a step's gradients are made and applied
        gptcore.train.job,
        gptcore.checkpoint.manager,
        gptcore.train.setup,
        gptcore.train.validate,
        gptcore.data.batches,
        gptcore.runtime.batch_size,  # with `batch_size: auto`, what decides the batch
        gptcore.runtime.memory,
        gptcore.train.schedule,
        gptcore.distributed.group,
    )


def _training_fingerprint(
    stage: str,
    params: PipelineParams,
    tokens: TokensResult,
    device: DeviceResult,
    schedule: TrainingConfig | None = None,
    batch: BatchChoice | None = None,
) -> str:
    from gptcore.finetune.start import start_identity

    runtime = {key: getattr(device.runtime, key) for key in _RUNTIME_KEYS}
    machine = {key: getattr(device.device, key) for key in ("device", "gpu_name", "torch_version")}
    # Where training starts: a fine-tune's base or init_from's model, by content, and the adapters' settings.
    weights, tune = params.start_weights(), params.finetune
    start = start_identity(weights, tune.adapters() if tune else None) if weights else None
    return fingerprint(
        stage,
        tokens.fingerprint,
        params.model.architecture.identity(),
        runtime,
        machine if stage == "smoke" else machine["device"],
        params.training_section(stage).identity(),
        schedule.identity() if schedule is not None else None,
        _training_code_version(),
        *([batch.batch_size, batch.grad_accum_steps] if batch else []),
        *([start] if start else []),  # absent for pretraining: its cached stages keep their keys
    )


def smoke_fingerprint(params: PipelineParams, tokens: TokensResult, device: DeviceResult) -> str:
    # A smoke record vouches for one machine: a different GPU or torch build needs its own. It trains
    # the full run's first steps, so the full section's settings (optimizer, schedule) are part of it.
    return _training_fingerprint("smoke", params, tokens, device, schedule=params.full)


def full_fingerprint(
    params: PipelineParams, tokens: TokensResult, device: DeviceResult, smoke: SmokeResult | None = None
) -> str:
    """With `batch_size: auto` the batch the smoke stage found is part of it."""
    return _training_fingerprint("full", params, tokens, device, batch=reused_batch(params, smoke))


def reused_batch(params: PipelineParams, smoke: SmokeResult | None) -> BatchChoice | None:
    """The smoke stage's `auto` batch, which full training trains with (None: configured)."""
    if params.runtime.batch_size != "auto" or smoke is None or not smoke.batch:
        return None
    return smoke.batch


def run_directory(params: PipelineParams, stage: str, stage_fingerprint: str) -> Path:
    """`<checkpoint_root>/iteration-N-<stage>-<fingerprint>`; a fine-tune's stage as
    `finetune-<name>-<method>-<stage>`."""
    root = Path(params.paths.checkpoint_root).resolve()
    if params.finetune is not None:
        stage = f"finetune-{params.finetune.name}-{params.finetune.method}-{stage}"
    return root / f"iteration-{params.iteration}-{stage}-{stage_fingerprint}"


def _train(
    params: PipelineParams,
    stage: TrainingStage,
    tokens: TokensResult,
    device: DeviceResult,
    directory: Path,
    callbacks: list[Any],
    resume: bool,
    nproc: int = 1,
    batch: BatchChoice | None = None,
) -> SummaryRecord:
    """One training of the stage (`tasks.training_launch`), in this process or on `nproc` local
    processes under torchrun, holding the device's slot (`tasks.device_slot`), with the device stage's
    decisions (its runtime; the smoke stage's `auto` batch); checkpoints go into `directory`."""
    from gptcore.distributed.torchrun import LaunchSpec
    from tasks.device_slot import device_slot
    from tasks.progress_bar import ProgressBar, wants_progress_bar
    from tasks.training_launch import launch_training

    if wants_progress_bar():
        callbacks = [*callbacks, ProgressBar(f"{stage} iteration {params.iteration}")]
    with device_slot(device.runtime.device, nproc, announce):  # one training per device at a time
        summary = launch_training(
            params,
            stage,
            callbacks,
            LaunchSpec(nproc) if nproc > 1 else None,
            on_text=_logger().info,
            train_tokens=Path(tokens.train),
            validation_tokens=Path(tokens.validation),
            checkpoint_directory=directory,
            resume=resume,
            tokenizer=Path(tokens.tokenizer_path),
            extra_fingerprint={"tokens": tokens.fingerprint},
            batch=batch,  # the smoke stage's, with `batch_size: auto`
            decided=device.runtime,  # the device stage's decision is what the run trains with
        )
    if summary is None:  # one node, so rank 0's: only a run that reported nothing gets here
        raise TrainingError(f"{stage} training ended without a summary; see the run's logs")
    return summary


def _logger() -> Any:
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # outside a flow or task run: Prefect raises MissingContextError
        return logging.getLogger("gptpipe.training")


@stage_task("smoke")
def smoke_task(
    fingerprint: str, params: PipelineParams, tokens: TokensResult, device: DeviceResult, run_context: dict
) -> SmokeResult:
    """The full run's first steps, bounded, gating full training: finite losses, train loss falling,
    validation loss not rising and below the uniform guess, memory that fits."""
    directory = run_directory(params, "smoke", fingerprint)
    progress = PrefectProgress(f"smoke-iteration-{params.iteration}", params.smoke.max_steps or 1)
    callbacks = [progress, *run_context.get("callbacks", [])]
    summary = _train(params, "smoke", tokens, device, directory, callbacks, resume=False)
    gate = judge(
        progress.losses,
        progress.val_losses,
        summary.peak_memory_bytes or 0,
        memory_limit(device.device),
        params.model.architecture.vocab_size,
    )
    startup = progress.startup
    full_steps = startup.schedule_steps  # the trainer's count for the full run on this data
    estimate = estimate_run(summary, full_plan(params, full_steps, tokens))
    sizing = data_sizing(startup, full_steps, tokens, params)
    if (warning := sizing.warning()) and params.finetune is None:  # a fine-tune's data is meant to be small
        announce(f"smoke: warning: {warning}")
    optimizer = params.training_section("smoke").optimizer
    record = {
        "fingerprint": fingerprint,
        "gate": gate.to_dict(),
        "optimizer": {"source": params.smoke_optimizer_source, **optimizer.model_dump()},
        "schedule": {"steps": full_steps, "warmup_steps": startup.warmup_steps},
        "precision": startup.precision,
        "val_losses": progress.val_losses,
        "summary": summary,
        "full_planned_steps": full_steps,
        "estimated_full_seconds": estimate.total_seconds if estimate else math.inf,
        "estimate": estimate.figures() if estimate else None,
        "data_sizing": {**sizing.figures(), "warning": sizing.warning()},
        "batch": BatchChoice(
            startup.batch_size, startup.grad_accum_steps, startup.batch_size_source, startup.batch_probe
        ),
    }
    record_path = directory / SMOKE_RECORD
    written = {**record, "summary": summary.to_dict(), "batch": asdict(record["batch"])}
    write_json_atomic(record_path, written, default=str)
    if not gate.passed:
        cause = gate.likely_cause(optimizer.learning_rate, startup.precision)
        raise TrainingError(
            f"smoke gate failed: {'; '.join(gate.reasons())}; likely cause: {cause}; record: {record_path}"
        )
    return SmokeResult(
        **record,
        files=file_record(record_path),
        outputs=[str(record_path)],
        figures={
            **SummaryRecord.headline(summary),
            "first_train_loss": gate.first_train_loss,
            "last_train_loss": gate.last_train_loss,
            "first_val_loss": gate.first_val_loss,
            "last_val_loss": gate.last_val_loss,
            "optimizer_source": params.smoke_optimizer_source,
            "full_planned_steps": full_steps,
            "estimated_full_seconds": round(estimate.total_seconds, 1) if estimate else None,
            **sizing.figures(),
        },
    )


def full_plan(params: PipelineParams, full_steps: int, tokens: TokensResult) -> RunPlan:
    """What the full run will do: its steps, evaluations of its validation examples, checkpoints."""
    validation_tokens = int(tokens.figures.get("validation_tokens", 0))
    block_size = params.model.architecture.block_size
    validation = examples_in(validation_tokens, block_size, params.full.validation_examples)
    return RunPlan.of(params.full, full_steps, validation)


def data_sizing(
    startup: StartupRecord, full_steps: int, tokens: TokensResult, params: PipelineParams
) -> DataSizing:
    """The full run's tokens (its schedule's steps at its global batch, on its ranks) and the train
    split's, against the model's parameters."""
    global_batch = startup.batch_size * startup.grad_accum_steps * full_world_size(params)
    return DataSizing(
        parameter_count=startup.parameter_count,
        train_tokens=int(tokens.figures.get("train_tokens", 0)),
        full_tokens=full_steps * global_batch * startup.sequence_length,
    )


def announce_smoke(figures: dict[str, Any]) -> None:
    announce(
        f"smoke: {figures.get('tokens_per_second', 0):.0f} tokens/s measured; train loss "
        f"{figures.get('first_train_loss', math.nan):.3f} -> {figures.get('last_train_loss', math.nan):.3f}, "
        f"validation {figures.get('first_val_loss', math.nan):.3f} -> "
        f"{figures.get('last_val_loss', math.nan):.3f}; "
        f"full run of {figures.get('full_planned_steps')} steps estimated at "
        f"{figures.get('estimated_full_seconds')} s"
    )


@stage_task("full")
def full_task(
    fingerprint: str,
    params: PipelineParams,
    tokens: TokensResult,
    device: DeviceResult,
    smoke: SmokeResult,
    run_context: dict,
) -> FullResult:
    """Full training, resumed from the run folder's latest checkpoint when an earlier attempt stopped."""
    from gptcore.checkpoint.files import latest_checkpoint, named_checkpoint

    directory = run_directory(params, "full", fingerprint)
    resume_from = latest_checkpoint(directory)
    if resume_from is not None:
        announce(f"full: resuming from {resume_from}")
    planned = smoke.full_planned_steps or params.full.max_steps or 1
    progress = PrefectProgress(f"full-iteration-{params.iteration}", planned)
    callbacks = [progress, *run_context.get("callbacks", [])]
    nproc = full_world_size(params)
    batch = reused_batch(params, smoke)
    resume = resume_from is not None
    summary = _train(params, "full", tokens, device, directory, callbacks, resume, nproc, batch)
    final = named_checkpoint(directory, "final") or latest_checkpoint(directory)
    outputs = [path for path in (final, named_checkpoint(directory, "best")) if path is not None]
    return FullResult(
        fingerprint=fingerprint,
        run_directory=str(directory),
        summary=summary,
        files=file_record(*outputs),
        outputs=[str(path) for path in outputs],
        figures={
            **SummaryRecord.headline(summary),
            **smoke_estimate(smoke, resume),
            **trained_share(progress.startup),
        },
    )


def trained_share(startup: StartupRecord | None) -> dict[str, Any]:
    """What the optimizer trained (all but a fine-tune's frozen base): the count and its share."""
    share = startup.trained_share if startup is not None else None
    if share is None:
        return {}
    return {
        "trainable_parameter_count": startup.trainable_parameter_count,
        "trainable_parameter_share": round(share, 6),
    }


def smoke_estimate(smoke: SmokeResult, resumed: bool) -> dict[str, float]:
    """The smoke stage's estimate of this run, next to its `elapsed_seconds`; a resumed run's elapsed
    time is only its last part, so it gets none."""
    if resumed or not math.isfinite(smoke.estimated_full_seconds):
        return {}
    return {"estimated_full_seconds": round(smoke.estimated_full_seconds, 1)}
