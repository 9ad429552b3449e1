"""The trainer: one `TrainJob` in, a summary dict out, progress through `TrainingCallback`s.

The trainer prints nothing: the CLI installs `gptcore.train.json_lines.JsonLinesCallback` for its JSON
lines, the
pipeline its MLflow adapter. Host synchronisation (`.item()`) happens only at log intervals,
evaluations and checkpoints, so CUDA keeps its queue full between them.

Exact resume: the data order of any step is a function of (seed, epoch, step in epoch), and a
checkpoint holds model, optimizer, schedule, scaler and every RNG state, so a resumed run replays the
uninterrupted one (bit for bit on CPU in fp32). A resume whose trajectory-determining config differs
from the checkpoint's is refused with the differing keys.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from gptcore.checkpoint.manager import Checkpointer, RunIdentity, TrainingParts
from gptcore.config import ModelConfig, PipelineParams, RuntimeConfig, TrainingConfig
from gptcore.data.batches import BatchLoader, StepPlan
from gptcore.data.tokenfile import TokenStream
from gptcore.distributed.group import agree_on_int, all_reduce_mean, all_reduce_sum, grad_scaler
from gptcore.errors import GptpipeError, TrainingError
from gptcore.model.gpt import GPT
from gptcore.runtime.batch_size import BatchChoice, memory_budget
from gptcore.runtime.device import DefaultsSource, Runtime, apply_runtime, resolve_runtime
from gptcore.runtime.flops import RunMeasures, Throughput
from gptcore.runtime.memory import StepMemory, TrainingMemory
from gptcore.tools.fingerprint import fingerprint
from gptcore.train.callbacks import TrainingCallback
from gptcore.train.guards import DivergenceGuard, NonFiniteGuard, is_out_of_memory
from gptcore.train.records import StepRecord
from gptcore.train.report import out_of_memory, startup_record, summary_record
from gptcore.train.setup import (
    choose_batch,
    data_parallel,
    make_optimizer,
    open_data,
    planned_steps,
    resume_config,
    seed_everything,
    warmup_cosine,
)
from gptcore.train.state import TrainState
from gptcore.train.validate import Evaluator

TokenSource = Path | TokenStream
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainJob:
    """Everything one training run needs. `device_defaults` supplies batch size, precision and workers
    for the resolved device when the runtime request leaves them unset (a ModelProfile or a callable
    such as `PipelineParams.defaults_for`)."""

    model: ModelConfig
    runtime: RuntimeConfig
    training: TrainingConfig
    train_tokens: TokenSource | None
    validation_tokens: TokenSource | None = None
    checkpoint_directory: Path | None = None
    resume: bool = False
    dry_run: bool = False
    device_defaults: DefaultsSource | None = None
    tokenizer: Path | None = None
    extra_fingerprint: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    world_size: int = 1  # data-parallel ranks, each a process in an initialised group (torchrun)
    rank: int = 0
    # The run whose learning-rate schedule this one follows (its warmup and length); None: its own.
    # A smoke run follows the full run's, so its steps are the full run's first steps.
    schedule: TrainingConfig | None = None
    schedule_world_size: int | None = None  # the ranks that run trains on; None: this run's
    batch: BatchChoice | None = None  # a batch decided before (the smoke stage's `auto`); None: decide

    @classmethod
    def from_params(cls, params: PipelineParams, stage: str = "full", **fields: Any) -> TrainJob:
        """A job for the `smoke` or `full` section of an iteration's parameters; a smoke job trains
        the full run's first steps (its optimizer, unless the smoke section names one, and schedule)."""
        return cls(
            model=params.model.architecture,
            runtime=params.runtime,
            training=params.training_section("smoke" if stage == "smoke" else "full"),
            device_defaults=params.defaults_for,
            schedule=params.full if stage == "smoke" else None,
            schedule_world_size=_full_world_size(params) if stage == "smoke" else None,
            **fields,
        )


def _full_world_size(params: PipelineParams) -> int:
    """The processes full training runs on (`runtime.nproc`, `auto` resolved on this machine)."""
    from gptcore.distributed.torchrun import resolve_nproc

    return resolve_nproc(params.runtime.nproc, params.runtime.device)


def train(job: TrainJob, callbacks: TrainingCallback | None = None) -> dict[str, Any]:
    """Run the job; return the summary. Failures reach the callbacks' `on_failure`, then propagate as
    a GptpipeError (out of memory included, with what to do about it)."""
    # Rank 0 alone prints, tracks and reports: the other ranks compute the same figures silently.
    events = (callbacks or TrainingCallback()) if job.rank == 0 else TrainingCallback()
    try:
        return _Run(job, events).execute()
    except GptpipeError as error:
        events.on_failure(str(error))
        raise
    except BaseException as error:
        events.on_failure(f"{type(error).__name__}: {error}".splitlines()[0])
        raise


# --- the run ----------------------------------------------------------------------------------------


def writes_checkpoints(job: TrainJob) -> bool:
    """Rank 0 of a real (not dry) run with a checkpoint folder writes the checkpoints."""
    return job.rank == 0 and not job.dry_run and job.checkpoint_directory is not None


def defaults_source(job: TrainJob) -> DefaultsSource:
    """Batch size, precision and workers for a resolved device when the runtime request leaves them unset."""
    if job.device_defaults is not None:
        return job.device_defaults
    from gptcore.config import DeviceDefaults

    fallback = DeviceDefaults(batch_size=8)
    return lambda device: (job.runtime.gpu if device == "cuda" else job.runtime.cpu) or fallback


def accumulate_gradients(
    forward: Any,
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    accum: int,
    runtime: Runtime,
    scaler: torch.amp.GradScaler,
    no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> torch.Tensor:
    """Forward and backward over the next `accum` micro-batches, adding the gradient of their mean loss
    (each micro-batch's mean loss / accum) into `.grad`. Returns the sum of the micro-batch losses,
    detached and still on the device (no host sync). With `no_sync` (DDP's), gradients are averaged
    across ranks only in the last micro-step's backward: the others just accumulate locally."""
    total = None
    for micro in range(accum):
        x, y = next(batches)
        skip_sync = no_sync is not None and micro < accum - 1
        with no_sync() if skip_sync else contextlib.nullcontext():
            with runtime.autocast():
                loss = forward(x, y)[1]  # the logits go now, not after the backward pass
            scaler.scale(loss / accum).backward()
        total = loss.detach() if total is None else total + loss.detach()
    return total


class _Run:
    """One training run: its components built from the job, then `execute`. Each component decides
    when it acts: the evaluator when an evaluation is due, the checkpointer when a checkpoint is, the
    guards when a run must stop; the loop (`train_steps`) only asks them."""

    def __init__(self, job: TrainJob, events: TrainingCallback) -> None:
        self.job = job
        self.events = events
        self.training = t = job.training
        runtime = apply_runtime(resolve_runtime(job.runtime, defaults_source(job)))
        seed_everything(t.seed)
        self.memory = TrainingMemory.before_model(runtime.device)
        self.model = GPT(job.model).to(runtime.device)
        self.model.activation_checkpointing = runtime.activation_checkpointing
        self.step_memory = StepMemory(
            job.model,
            self.model.parameter_count(),
            runtime.precision,
            runtime.activation_checkpointing,
            runtime.device,
            checkpoint_snapshot=t.async_checkpoints and writes_checkpoints(job),
        )
        self.batch = choose_batch(job, runtime, self.model, self.step_memory, self.memory.held())
        self.runtime: Runtime = replace(
            runtime,
            batch_size=self.batch.batch_size,
            grad_accum_steps=self.batch.grad_accum_steps,
            batch_size_source=self.batch.source,
        )
        self.plan = StepPlan(self.runtime.batch_size, self.runtime.grad_accum_steps, job.world_size, job.rank)
        self.train_set, self.val_set = open_data(job, self.plan)
        self.ddp = data_parallel(self.model, job, self.runtime)
        replica = self.ddp or self.model
        self.forward = torch.compile(replica) if self.runtime.compile else replica
        self.optimizer = make_optimizer(self.model, t, self.runtime)
        self.planned_steps = planned_steps(t, self.train_set, self.plan)
        self.schedule = warmup_cosine(job, self.train_set, self.plan)
        self.scaler = grad_scaler(self.runtime.device, self.runtime.uses_grad_scaler, job.world_size)
        self.state = TrainState(self.plan.steps_per_epoch(self.train_set.count) if self.train_set else 1)
        self.evaluator = Evaluator(
            self.val_set,
            self.train_set,
            self.runtime,
            t.eval_every,
            t.eval_at_start,
            job.world_size,
            job.rank,
        )
        self.guard = NonFiniteGuard(
            self.runtime.precision,
            self.scaler.is_enabled(),
            t.max_skipped_steps,
            immediate=self.runtime.device != "cuda",  # on CUDA read one step late, keeping the queue full
            agree=all_reduce_sum,
        )
        # A run that is another's first steps (a smoke run) is judged by its gate, on all its figures.
        self.divergence = DivergenceGuard(
            job.model,
            self.schedule.warmup_steps,
            self.schedule.peak,
            self.runtime.precision,
            enabled=job.schedule is None,
        )
        self.config = resume_config(job, self.train_set, self.plan, self.runtime)
        self.fingerprint = fingerprint(self.config)
        tokenizer = str(Path(job.tokenizer).resolve()) if job.tokenizer is not None else None
        self.checkpointer = Checkpointer(
            job.checkpoint_directory,
            t.checkpoint_every,
            t.keep_last,
            writes=writes_checkpoints(job),
            parts=TrainingParts(self.model, self.optimizer, self.schedule, self.scaler, self.state),
            background=t.async_checkpoints,
            identity=RunIdentity(
                self.config, self.fingerprint, job.model.model_dump(), job.metadata, tokenizer
            ),
        )
        self.resumed_from: Path | None = None
        self.last_train_loss: float | None = None
        self.tokens_per_step = self.plan.global_batch * job.model.block_size
        self.meter = Throughput(self.tokens_per_step)
        self.measures = RunMeasures.of(self.model, self.runtime, self.step_memory, job.world_size)

    # --- resume and checkpoints -------------------------------------------------------------------

    def restore(self) -> None:
        self.resumed_from = self.checkpointer.restore()
        if self.resumed_from is None:
            log.warning(
                "warning: --resume: no checkpoint in %s yet; starting from step 0",
                self.job.checkpoint_directory,
            )
            return  # the startup line shows start_step 0 and resumed_from null
        self.state.step = agree_on_int(self.state.step, "the resume step", self.runtime.device)

    def save(self, kind: str) -> None:
        """Checkpoint `kind` of the run as it is now (rank 0 of a real run alone writes); the final one
        is on disk before this returns, the others are reported when their write completes."""
        losses = {"train_loss": self.last_train_loss, "val_loss": self.evaluator.last_val_loss}
        path = self.checkpointer.save(kind, losses)
        if path is not None and kind != "best":  # on disk before the run ends, however it ends
            self.guard.last_checkpoint = str(path)
        self.report_checkpoints(wait=kind == "final")

    def report_checkpoints(self, wait: bool = False) -> None:
        """The checkpoint events of the writes completed (with `wait`, after the one in flight)."""
        for written in self.checkpointer.finished(wait):
            info = {"step": written.step, "kind": written.kind, "seconds": written.seconds}
            self.events.on_checkpoint(written.path, info)

    # --- evaluation -------------------------------------------------------------------------------

    def evaluate(self) -> None:
        """One evaluation: its record, the divergence guard, and the best checkpoint when it improved."""
        record = self.evaluator(self.model, self.state.step)
        if record is None:
            return
        self.events.on_eval(record.to_dict())
        self.divergence.check(self.state.step, record.val_loss, self.checkpointer.last_good)
        if self.state.step > 0 and self.state.improves(record.val_loss):  # step 0: nobody's best
            self.save("best")

    # --- the loop ---------------------------------------------------------------------------------

    def _grad_norm(self, clip: float) -> torch.Tensor:
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        return torch.nn.utils.clip_grad_norm_(parameters, clip if clip > 0 else float("inf"), foreach=True)

    def _log(self, loss_sum: torch.Tensor, steps: int, grad_norm: torch.Tensor) -> None:
        mean_over_ranks = all_reduce_mean(loss_sum)  # every rank gets the same value: they stop together
        step = self.state.step
        self.last_train_loss = float(mean_over_ranks.item()) / (steps * self.plan.grad_accum_steps)
        if not math.isfinite(self.last_train_loss):
            raise TrainingError(
                f"training loss is {self.last_train_loss} at step {step}; stopped (the last checkpoint "
                "is kept): lower the learning rate or use --precision bf16/fp32"
            )
        steps_per_second, tokens_per_second = self.meter.take_interval()
        record = StepRecord(
            step=step,
            train_loss=self.last_train_loss,
            learning_rate=self.schedule.rate(step - 1),
            grad_norm=float(grad_norm.item()),
            tokens_per_second=tokens_per_second,
            steps_per_second=steps_per_second,
            mfu=self.measures.mfu(tokens_per_second),
            epoch=(step - 1) // self.state.steps_per_epoch,
        )
        self.events.on_step(record.to_dict())

    def _optimizer_step(self, batches: Iterator[Any], logging: bool) -> tuple[torch.Tensor, Any, float]:
        """Gradients of the next global batch, clipped, applied at the schedule's rate. Returns the summed
        micro-batch loss (on the device), the gradient norm where it was needed and the scale before."""
        clip = self.training.optimizer.grad_clip
        self.schedule.apply(self.optimizer, self.state.step)
        no_sync = self.ddp and self.ddp.no_sync
        loss = accumulate_gradients(
            self.forward, batches, self.plan.grad_accum_steps, self.runtime, self.scaler, no_sync
        )
        self.scaler.unscale_(self.optimizer)
        needs_norm = clip > 0 or logging or not self.guard.uses_grad_scaler
        grad_norm = self._grad_norm(clip) if needs_norm else None
        scale_before = self.scaler.get_scale() if self.guard.uses_grad_scaler else 0.0
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss, grad_norm, scale_before

    def train_steps(self) -> None:
        """The loop: an optimizer step, then whatever is due (a log line, an evaluation, a checkpoint)."""
        t = self.training
        loader = BatchLoader(
            self.train_set, self.runtime.device, self.runtime.pin_memory, self.runtime.workers
        )
        indices = self.plan.micro_batch_indices(
            self.train_set.count, t.seed, self.state.step, self.planned_steps
        )
        batches = loader.batches(indices)
        loss_sum = torch.zeros((), device=self.runtime.device)
        interval = 0
        self.meter.start()
        try:
            while self.state.step < self.planned_steps:
                logging = (
                    self.state.step + 1
                ) % t.log_every == 0 or self.state.step + 1 == self.planned_steps
                step_loss, grad_norm, scale_before = self._optimizer_step(batches, logging)
                self.state.step += 1
                self.meter.step_done()
                self.guard.observe(self.state.step, step_loss, grad_norm)
                scale_after = self.scaler.get_scale() if self.guard.uses_grad_scaler else 0.0
                if self.guard.scaler_step_taken(self.state.step, scale_before, scale_after):
                    loss_sum += step_loss  # a step the fp16 scaler skipped has no loss worth averaging
                    interval += 1
                if logging and interval:
                    self._log(loss_sum, interval, grad_norm)
                    loss_sum.zero_()
                    interval = 0
                self._between_steps()
            self.guard.settle()
        finally:
            loader.close()

    def _between_steps(self) -> None:
        """Evaluation and periodic checkpoints, when due, outside the throughput clock."""
        step = self.state.step
        self.report_checkpoints()  # a background write that completed since the last step
        evaluate = self.evaluator.due(step, self.planned_steps)
        save = self.checkpointer.due(step, self.planned_steps)
        if not (evaluate or save):
            return
        self.guard.settle()  # never evaluate or checkpoint weights a non-finite step touched
        if evaluate:
            self.evaluate()
        if save:
            self.save("step")
        self.meter.start()

    def execute(self) -> dict[str, Any]:
        """The run, holding its checkpoint folder (rank 0 of a real run; a dry run writes nothing). A run
        that fails still lets the checkpoint write in flight finish and reports it before the failure."""
        with self.checkpointer.holding():
            try:
                return self._execute()
            except BaseException:
                self.checkpointer.settle()
                self.report_checkpoints()
                raise

    def _execute(self) -> dict[str, Any]:
        started = time.perf_counter()
        if self.job.resume and not self.job.dry_run:
            self.restore()
        start_step = self.state.step
        self.events.on_start(startup_record(self).to_dict())
        if self.job.dry_run:
            return self.end(started, start_step)
        self.memory.start(memory_budget(self.runtime.device, self.memory.held()))
        try:
            if self.evaluator.due_at_start(self.state.step):
                self.evaluate()  # the untrained baseline that later evaluations are judged by
            self.train_steps()
        except (torch.OutOfMemoryError, RuntimeError) as error:
            if not is_out_of_memory(error):
                raise
            self.checkpointer.settle()  # the write in flight completes: the message can name it
            raise TrainingError(out_of_memory(self).response(error, self.checkpointer.latest())) from None
        self.evaluate()
        self.save("final")
        return self.end(started, start_step)

    def end(self, started: float, start_step: int) -> dict[str, Any]:
        summary = summary_record(self, started, start_step).to_dict()
        self.events.on_end(summary)
        return summary
