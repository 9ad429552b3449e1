"""What a run reports of itself: the start-up record (what it trains with, before its first step) and
the summary (its figures and checkpoints at the end), read off the trainer's components."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

import torch

from gptcore.checkpoint.files import state_bytes
from gptcore.checkpoint.manager import Checkpointer
from gptcore.data.batches import ExampleSet, StepPlan
from gptcore.finetune.lora import trainable_parameters
from gptcore.model.gpt import GPT
from gptcore.model.size import FLOP_FORMULA, ModelSize
from gptcore.runtime.attention import attention_backend
from gptcore.runtime.batch_size import BatchChoice
from gptcore.runtime.decided import Runtime
from gptcore.runtime.device import device_report
from gptcore.runtime.flops import RunMeasures, Throughput
from gptcore.runtime.load import MachineLoad
from gptcore.runtime.memory import TrainingMemory, peak_memory_bytes
from gptcore.train.compile import compiled_graphs
from gptcore.train.config import TrainingConfig
from gptcore.train.job import TrainJob
from gptcore.train.records import StartupRecord, SummaryRecord
from gptcore.train.schedule import WarmupCosine
from gptcore.train.state import TrainState
from gptcore.train.validate import Evaluator


class Trainer(Protocol):
    """What the records read of a run: the components `gptcore.train.trainer.Trainer` holds (that module
    imports this one, so the records name the parts they read instead of importing the class)."""

    job: TrainJob
    training: TrainingConfig
    runtime: Runtime
    model: GPT
    batch: BatchChoice
    plan: StepPlan
    train_set: ExampleSet | None
    val_set: ExampleSet | None
    planned_steps: int | None
    size: ModelSize
    schedule: WarmupCosine
    state: TrainState
    measures: RunMeasures
    meter: Throughput
    machine_load: MachineLoad | None
    memory: TrainingMemory
    evaluator: Evaluator
    checkpointer: Checkpointer
    optimizer: torch.optim.Optimizer
    fingerprint: str
    tokens_per_step: int
    compile_seconds: float | None
    graphs_at_start: int
    resumed_from: Path | None
    last_train_loss: float | None


def startup_record(trainer: Trainer) -> StartupRecord:
    """What the run trains with, before its first step."""
    job, steps, measures = trainer.job, trainer.planned_steps, trainer.measures
    device = device_report(trainer.runtime.device, precision_speeds=False)
    machine = ("processor", "gpu_name", "gpu_memory_bytes", "torch_version", "cuda_available")
    directory, resumed = job.checkpoint_directory, trainer.resumed_from
    return StartupRecord(
        **{key: getattr(device, key) for key in machine},
        **trainer.runtime.to_dict(),
        compile_seconds=trainer.compile_seconds,
        attention_backend=attention_backend(job.model, trainer.runtime.device, trainer.runtime.dtype),
        **asdict(measures),  # FLOPs per token, the peak they are judged by, the memory estimate
        estimated_peak_memory_bytes=measures.estimated_peak_memory_bytes,
        flop_formula=FLOP_FORMULA,
        batch_probe=trainer.batch.figures,
        sequence_length=job.model.block_size,
        parameter_count=trainer.model.parameter_count(),
        non_embedding_parameter_count=trainer.size.non_embedding_parameter_count,
        trainable_parameter_count=trainable_parameters(trainer.model)[0],
        matmul_parameter_count=trainer.model.matmul_parameter_count(),
        max_steps=trainer.training.max_steps,
        max_flops=trainer.training.max_flops,
        tokens_per_parameter=trainer.training.tokens_per_parameter,
        epochs=trainer.training.epochs,
        planned_steps=steps,
        schedule_steps=trainer.schedule.total_steps,
        warmup_steps=trainer.schedule.warmup_steps,
        tokens_per_step=trainer.tokens_per_step,
        planned_tokens=steps * trainer.tokens_per_step if steps else None,
        planned_flops=float(steps * trainer.tokens_per_step * measures.flops_per_token) if steps else None,
        train_examples=trainer.train_set.count if trainer.train_set else None,
        validation_examples=trainer.val_set.count if trainer.val_set else None,
        steps_per_epoch=trainer.state.steps_per_epoch if trainer.train_set else None,
        eval_every=trainer.training.eval_every,
        eval_at_start=trainer.training.eval_at_start,
        checkpoint_every=trainer.training.checkpoint_every,
        checkpoint_directory=str(directory) if directory else None,
        world_size=job.world_size,
        per_rank_batch_size=trainer.plan.batch_size,
        global_batch=trainer.plan.global_batch,
        start_step=trainer.state.step,
        resumed_from=str(resumed) if resumed else None,
        fingerprint=trainer.fingerprint,
        dry_run=job.dry_run,
    )


def summary_record(trainer: Trainer, started: float, start_step: int) -> SummaryRecord:
    """The run's figures and checkpoints at its end (`started`: its perf_counter start)."""
    trained = not trainer.job.dry_run
    steps_per_second = trainer.meter.steps_per_second if trained else 0.0
    tokens_per_second = trainer.meter.tokens_per_second if trained else 0.0
    return SummaryRecord(
        steps=trainer.state.step,
        planned_steps=trainer.planned_steps,
        tokens_per_second=tokens_per_second,
        steps_per_second=steps_per_second,
        mfu=trainer.measures.mfu(tokens_per_second),
        **(trainer.machine_load.whole() if trainer.machine_load else {}),
        peak_flops=trainer.measures.peak_flops,
        tokens_seen=trainer.state.step * trainer.tokens_per_step,
        training_flops=float(trainer.state.step * trainer.tokens_per_step * trainer.measures.flops_per_token),
        peak_memory_bytes=peak_memory_bytes(trainer.runtime.device),
        training_peak_memory_bytes=trainer.memory.peak() if trained else None,
        training_peak_memory_source=trainer.memory.source,
        estimated_peak_memory_bytes=trainer.measures.estimated_peak_memory_bytes,
        final_train_loss=trainer.last_train_loss,
        final_val_loss=trainer.evaluator.last_val_loss,
        best_val_loss=trainer.state.best_val_loss,
        unigram_val_loss=trainer.evaluator.unigram,
        elapsed_seconds=time.perf_counter() - started,
        steady_steps_seconds=(trainer.planned_steps or 0) / steps_per_second if steps_per_second else None,
        compile_seconds=trainer.compile_seconds,
        recompilations=compiled_graphs() - trainer.graphs_at_start if trainer.runtime.compile else None,
        **asdict(trainer.checkpointer.figures()),
        evaluation_seconds=trainer.evaluator.seconds,
        evaluated_examples=trainer.evaluator.examples,
        optimizer_state_bytes=state_bytes(trainer.optimizer.state),  # moments of what trains (LoRA: adapters)
        start_step=start_step,
        dry_run=trainer.job.dry_run,
    )


def startup_line(startup: StartupRecord) -> str:
    """The start-up record in one line for a person: where and how it trains, compiled or not and why,
    the attention kernel."""
    if startup.compile:
        took = f" in {startup.compile_seconds:.1f} s" if startup.compile_seconds is not None else ""
        how = f"compiled{took} ({startup.compile_source})"
    else:
        how = f"eager ({startup.compile_source})"
    return (
        f"{startup.device} {startup.precision}, batch {startup.batch_size} x {startup.grad_accum_steps}"
        f" ({startup.batch_size_source}), {how}, attention {startup.attention_backend},"
        f" {startup.parameter_count or 0:,} parameters"
    )
