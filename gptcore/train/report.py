"""What a training run reports, read from its components: the startup record, the summary, and what it
had when a step ran out of memory. Functions of the run (`gptcore.train.trainer._Run`), so the run class holds
the loop and its components, and the records' assembly lives beside the records."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gptcore.runtime.batch_size import OutOfMemory
from gptcore.runtime.device import device_report
from gptcore.runtime.flops import FLOP_FORMULA
from gptcore.runtime.memory import peak_memory_bytes
from gptcore.train.records import StartupRecord, SummaryRecord

if TYPE_CHECKING:
    from gptcore.train.trainer import _Run


def startup_record(run: _Run) -> StartupRecord:
    """What the run trains with, before its first step."""
    cfg, measures, training = run.job.model, run.measures, run.training
    report = device_report(run.runtime.device)
    directory = run.job.checkpoint_directory
    return StartupRecord(
        **{k: report[k] for k in ("processor", "gpu_name", "gpu_memory_bytes", "torch_version")},
        cuda_available=report["cuda_available"],
        **run.runtime.to_dict(),
        batch_probe=run.batch.figures,
        sequence_length=cfg.block_size,
        parameter_count=run.model.parameter_count(),
        matmul_parameter_count=run.model.matmul_parameter_count(),
        max_steps=training.max_steps,
        epochs=training.epochs,
        planned_steps=run.planned_steps,
        schedule_steps=run.schedule.total_steps,
        warmup_steps=run.schedule.warmup_steps,
        tokens_per_step=run.tokens_per_step,
        planned_tokens=run.planned_steps * run.tokens_per_step if run.planned_steps else None,
        train_examples=run.train_set.count if run.train_set else None,
        validation_examples=run.val_set.count if run.val_set else None,
        steps_per_epoch=run.state.steps_per_epoch if run.train_set else None,
        estimated_peak_memory_bytes=measures.estimated_peak_memory_bytes,
        estimated_memory=measures.estimated_memory,
        flops_per_token=measures.flops_per_token,
        flop_formula=FLOP_FORMULA,
        peak_flops=measures.peak_flops,
        peak_flops_source=measures.peak_flops_source,
        checkpoint_directory=str(directory) if directory else None,
        world_size=run.job.world_size,
        per_rank_batch_size=run.plan.batch_size,
        global_batch=run.plan.global_batch,
        start_step=run.state.step,
        resumed_from=str(run.resumed_from) if run.resumed_from else None,
        fingerprint=run.fingerprint,
        dry_run=run.job.dry_run,
    )


def summary_record(run: _Run, started: float, start_step: int) -> SummaryRecord:
    """The run's figures and checkpoints at its end (`started`: its perf_counter start)."""
    trained = not run.job.dry_run
    steps_per_second = run.meter.steps_per_second if trained else 0.0
    tokens_per_second = run.meter.tokens_per_second if trained else 0.0
    planned = run.planned_steps or 0
    saved = run.checkpointer.saved
    return SummaryRecord(
        steps=run.state.step,
        planned_steps=run.planned_steps,
        tokens_per_second=tokens_per_second,
        steps_per_second=steps_per_second,
        mfu=run.measures.mfu(tokens_per_second),
        peak_flops=run.measures.peak_flops,
        peak_memory_bytes=peak_memory_bytes(run.runtime.device),
        training_peak_memory_bytes=run.memory.peak() if trained else None,
        training_peak_memory_source=run.memory.source,
        estimated_peak_memory_bytes=run.measures.estimated_peak_memory_bytes,
        final_train_loss=run.last_train_loss,
        final_val_loss=run.evaluator.last_val_loss,
        best_val_loss=run.state.best_val_loss,
        unigram_val_loss=run.evaluator.unigram,
        elapsed_seconds=time.perf_counter() - started,
        estimated_total_seconds=planned / steps_per_second if steps_per_second > 0 else None,
        checkpoint_save_seconds=run.checkpointer.seconds,
        checkpoint_stall_seconds=run.checkpointer.stall_seconds,
        final_checkpoint=saved.get("final"),
        best_checkpoint=saved.get("best"),
        latest_checkpoint=saved.get("latest"),
        start_step=start_step,
        dry_run=run.job.dry_run,
    )


def out_of_memory(run: _Run) -> OutOfMemory:
    """What this run had, for the response to a step that ran out of memory."""
    r = run.runtime
    return OutOfMemory(
        r.device,
        r.batch_size,
        r.grad_accum_steps,
        run.job.world_size,
        run.job.model.block_size,
        run.step_memory.total,
        run.memory.budget,
    )
