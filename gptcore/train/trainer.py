"""The trainer: one `TrainJob` in, a summary dict out, progress through `TrainingCallback`s.

The trainer prints nothing: the CLI installs `gptcore.train.json_lines.JsonLinesCallback` for its JSON
lines, the pipeline its MLflow adapter. Host synchronisation (`.item()`) happens only at log intervals,
evaluations and checkpoints, so CUDA keeps its queue full between them.

Exact resume: the data order of any step is a function of (seed, epoch, step in epoch), and a
checkpoint holds model, optimizer, schedule, scaler and every RNG state, so a resumed run replays the
uninterrupted one (bit for bit on CPU in fp32). A resume whose trajectory-determining settings differ
from the checkpoint's is refused with the differing keys.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from gptcore.checkpoint.manager import Losses, TrainingParts
from gptcore.data.batches import BatchLoader, StepPlan
from gptcore.distributed.group import all_reduce_mean, grad_scaler
from gptcore.errors import GptpipeError, TrainingError, first_line
from gptcore.finetune.start import start_from
from gptcore.model.gpt import GPT
from gptcore.model.size import ModelSize
from gptcore.runtime.batch_size import OutOfMemory, memory_budget
from gptcore.runtime.decided import Runtime
from gptcore.runtime.device import apply_runtime
from gptcore.runtime.flops import RunMeasures, Throughput
from gptcore.runtime.load import MachineLoad
from gptcore.runtime.memory import StepMemory, TrainingMemory, is_out_of_memory
from gptcore.tools.faults import kill_point
from gptcore.tools.fingerprint import fingerprint
from gptcore.train.callbacks import TrainingCallback
from gptcore.train.compile import compile_for_training, compiled_graphs
from gptcore.train.job import TrainJob
from gptcore.train.records import StartupRecord, StepRecord, SummaryRecord
from gptcore.train.reports import startup_record, summary_record
from gptcore.train.setup import (
    choose_batch,
    data_parallel,
    make_checkpointer,
    make_guards,
    make_optimizer,
    open_data,
    optimizer_state_bytes,
    planned_steps,
    seed_everything,
    trajectory_settings,
    warmup_cosine,
)
from gptcore.train.state import TrainState
from gptcore.train.step import OptimizerStep
from gptcore.train.validate import Evaluator

log = logging.getLogger(__name__)


def train(job: TrainJob, callbacks: TrainingCallback | None = None) -> SummaryRecord:
    """Run the job; return the summary. Failures reach the callbacks' `on_failure`, then propagate as
    a GptpipeError (out of memory included, with what to do about it)."""
    # Rank 0 alone prints, tracks and reports: the other ranks compute the same figures silently.
    events = (callbacks or TrainingCallback()) if job.rank == 0 else TrainingCallback()
    try:
        return Trainer(job, events).run()
    except GptpipeError as error:
        events.on_failure(str(error))
        raise
    except BaseException as error:
        events.on_failure(first_line(f"{type(error).__name__}: {error}"))
        raise


class Trainer:
    """One training run: its components built from the job, then `run()`. Each component decides when
    it acts: the evaluator when an evaluation is due, the checkpointer when a checkpoint is, the guards
    when a run must stop; the loop (`train_steps`) only asks them."""

    def __init__(self, job: TrainJob, events: TrainingCallback) -> None:
        self.job, self.events, self.training = job, events, job.training
        t = job.training
        runtime = apply_runtime(job.decide_runtime())
        seed_everything(t.seed)
        self.memory = TrainingMemory.before_model(runtime.device)
        self.model = GPT(job.model)
        start_from(self.model, job.model, job.init_weights, job.lora, runtime.device)  # fine-tuning
        self.model.to(runtime.device)
        self.model.activation_checkpointing = runtime.activation_checkpointing
        snapshot = t.async_checkpoints and job.writes_checkpoints  # a background write copies the state
        state = optimizer_state_bytes(self.model, t)
        self.step_memory = StepMemory.for_run(self.model, runtime, snapshot, optimizer_state=state)
        self.batch = choose_batch(job, runtime, self.model, self.step_memory, self.memory.held())
        self.runtime: Runtime = self.batch.applied_to(runtime)
        self.plan = StepPlan(self.runtime.batch_size, self.runtime.grad_accum_steps, job.world_size, job.rank)
        self.train_set, self.val_set = open_data(job, self.plan)
        self.ddp = data_parallel(self.model, job, self.runtime)
        replica = self.ddp or self.model
        self.optimizer = make_optimizer(self.model, t, self.runtime)
        self.size = ModelSize.of(job.model)
        self.planned_steps = planned_steps(t, self.train_set, self.plan, self.size)
        self.schedule = warmup_cosine(job, self.train_set, self.plan, self.size)
        self.scaler = grad_scaler(self.runtime.device, self.runtime.uses_grad_scaler, job.world_size)
        self.state = TrainState(self.plan.steps_per_epoch(self.train_set.count) if self.train_set else 1)
        self.evaluator = Evaluator.for_job(job, self.val_set, self.train_set, self.runtime)
        self.nonfinite_guard, self.divergence_guard = make_guards(job, runtime, self.scaler, self.schedule)
        self.optimizer_step = OptimizerStep(
            self.model,
            replica,
            self.optimizer,
            self.schedule,
            self.scaler,
            self.runtime,
            t.optimizer.grad_clip,
            self.nonfinite_guard,
            self.ddp,
        )  # fmt: skip  (the steps run eager until `compile_at_start` gives them the compiled module)
        self.compile_seconds: float | None = None
        self.graphs_at_start = 0
        self.trajectory = trajectory_settings(job, self.train_set, self.plan, self.runtime)
        self.fingerprint = fingerprint(self.trajectory)
        parts = TrainingParts(self.model, self.optimizer, self.schedule, self.scaler, self.state)
        self.checkpointer = make_checkpointer(job, parts, self.trajectory, self.fingerprint)
        self.resumed_from: Path | None = None
        self.last_train_loss: float | None = None
        self.tokens_per_step = self.plan.global_batch * job.model.block_size
        self.meter = Throughput(self.tokens_per_step)
        self.machine_load: MachineLoad | None = None  # from the first step on
        self.measures = RunMeasures.of(
            self.model, self.runtime, self.step_memory, job.world_size, measure_peak=not job.dry_run
        )

    # --- the run ----------------------------------------------------------------------------------

    def run(self) -> SummaryRecord:
        """The run, holding its checkpoint folder (rank 0 of a real run; a dry run writes nothing): resume,
        train, the final evaluation and checkpoint, the summary. A run that fails still lets the
        checkpoint write in flight finish and reports it before the failure."""
        started = time.perf_counter()
        with self.checkpointer.holding():
            try:
                if self.job.resume and not self.job.dry_run:
                    self.resumed_from = self.checkpointer.restore(self.runtime.device)
                start_step = self.state.step
                if not self.job.dry_run:
                    budget = memory_budget(self.runtime.device, self.memory.held())  # before compiling
                    self.memory.start(budget)
                    with self.out_of_memory_stops():  # the probe runs a step's forward and backward
                        self.compile_at_start()
                self.events.on_start(self.startup_record())
                if not self.job.dry_run:
                    self.train_and_finish()
            except BaseException:
                self.checkpointer.settle()  # the write in flight completes: a message can name it
                self.report_checkpoints()
                raise
        summary = self.summary_record(started, start_step)
        self.events.on_end(summary)
        return summary

    def compile_at_start(self) -> None:
        """Compile the steps' module now, probed at their shape (`gptcore.train.compile`)."""
        replica = self.optimizer_step.forward
        model = self.job.model
        module, self.runtime, self.compile_seconds = compile_for_training(
            replica, self.runtime, self.plan.batch_size, model.block_size, model.vocab_size
        )
        self.optimizer_step.forward = module
        self.optimizer_step.runtime = self.runtime
        self.graphs_at_start = compiled_graphs() if self.runtime.compile else 0

    def train_and_finish(self) -> None:
        """The baseline evaluation when due, the steps, then the final evaluation and checkpoint. A step
        that runs out of memory ends the run with what to change (`OutOfMemory`)."""
        self.memory.start(self.memory.budget)  # the training's peak from here, not the compiler's
        with self.out_of_memory_stops():
            if self.evaluator.due_at_start(self.state.step):
                self.evaluate()  # the untrained baseline that later evaluations are judged by
            self.train_steps()
        self.evaluate()
        self.save("final")

    @contextlib.contextmanager
    def out_of_memory_stops(self) -> Iterator[None]:
        """Running out of memory in the block ends the run with what to change (`OutOfMemory`)."""
        try:
            yield
        except (torch.OutOfMemoryError, RuntimeError) as error:
            if not is_out_of_memory(error):
                raise
            self.checkpointer.settle()
            raise TrainingError(self.out_of_memory().response(error, self.checkpointer.latest())) from None

    # --- the loop ---------------------------------------------------------------------------------

    def train_steps(self) -> None:
        """The loop: an optimizer step, then whatever is due (a log line, an evaluation, a checkpoint)."""
        t, state, r = self.training, self.state, self.runtime
        loader = BatchLoader(self.train_set, r.device, r.pin_memory, r.workers)
        indices = self.plan.micro_batch_indices(self.train_set.count, t.seed, state.step, self.planned_steps)
        batches = loader.batches(indices)
        loss_sum, counted = torch.zeros((), device=r.device), 0
        self.meter.start()
        self.machine_load = MachineLoad()
        try:
            while state.step < self.planned_steps:
                logging = (state.step + 1) % t.log_every == 0 or state.step + 1 == self.planned_steps
                step_loss, grad_norm = self.optimizer_step(batches, state.step, logging)
                state.step += 1
                self.meter.step_done()
                if self.nonfinite_guard.observe(state.step, step_loss, grad_norm):
                    loss_sum += step_loss  # a step the fp16 scaler skipped has no loss worth averaging
                    counted += 1
                if logging and counted:
                    self.log_step(loss_sum, counted, grad_norm)
                    loss_sum.zero_()
                    counted = 0
                self.between_steps()
                kill_point("step", state.step)  # a kill test's placed `kill -9` (gptcore.tools.faults)
            self.nonfinite_guard.settle()
        finally:
            loader.close()

    def log_step(self, loss_sum: torch.Tensor, steps: int, grad_norm: torch.Tensor) -> None:
        """The step record of the interval just ended: its mean loss over every rank, rates, the MFU."""
        mean_over_ranks = all_reduce_mean(loss_sum)  # every rank gets the same value: they stop together
        step = self.state.step
        self.last_train_loss = float(mean_over_ranks.item()) / (steps * self.plan.grad_accum_steps)
        self.nonfinite_guard.check_train_loss(step, self.last_train_loss)
        steps_per_second, tokens_per_second = self.meter.take_interval()
        record = StepRecord(
            step=step,
            train_loss=self.last_train_loss,
            learning_rate=self.schedule.rate(step - 1),
            grad_norm=float(grad_norm.item()),
            tokens_per_second=tokens_per_second,
            steps_per_second=steps_per_second,
            mfu=self.measures.mfu(tokens_per_second),
            **self.machine_load.interval(),
            epoch=(step - 1) // self.state.steps_per_epoch,
        )
        self.events.on_step(record)

    def between_steps(self) -> None:
        """Evaluation and periodic checkpoints, when due, outside the throughput clock."""
        step = self.state.step
        self.report_checkpoints()  # a background write that completed since the last step
        evaluate = self.evaluator.due(step, self.planned_steps)
        save = self.checkpointer.due(step, self.planned_steps)
        if not (evaluate or save):
            return
        self.nonfinite_guard.settle()  # never evaluate or checkpoint weights a non-finite step touched
        if evaluate:
            self.evaluate()
        if save:
            self.save("step")
        self.meter.start()

    # --- evaluation and checkpoints -------------------------------------------------------

    def evaluate(self) -> None:
        """One evaluation: its record, the divergence guard, and the best checkpoint when it improved."""
        record = self.evaluator(self.model, self.state.step)
        if record is None:
            return
        self.events.on_eval(record)
        self.divergence_guard.check(self.state.step, record.val_loss, self.checkpointer.last_good)
        if self.state.step > 0 and self.state.improves(record.val_loss):  # step 0: nobody's best
            self.save("best")

    def save(self, kind: str) -> None:
        """Checkpoint `kind` of the run as it is now (rank 0 of a real run alone writes); the final one
        is on disk before this returns, the others are reported when their write completes."""
        losses = Losses(self.last_train_loss, self.evaluator.last_val_loss)
        path = self.checkpointer.save(kind, losses)
        if path is not None and kind != "best":  # on disk before the run ends, however it ends
            self.nonfinite_guard.last_checkpoint = str(path)
        self.report_checkpoints(wait=kind == "final")

    def report_checkpoints(self, wait: bool = False) -> None:
        """The checkpoint events of the writes completed (with `wait`, after the one in flight)."""
        for written in self.checkpointer.finished(wait):
            info = {"step": written.step, "kind": written.kind, "seconds": written.seconds}
            self.events.on_checkpoint(written.path, info)

    # --- records ----------------------------------------------------------------------------------

    def startup_record(self) -> StartupRecord:
        """What the run trains with, before its first step (`gptcore.train.reports`)."""
        return startup_record(self)

    def summary_record(self, started: float, start_step: int) -> SummaryRecord:
        """The run's figures and checkpoints at its end (`started`: its perf_counter start)."""
        return summary_record(self, started, start_step)

    def out_of_memory(self) -> OutOfMemory:
        """What this run had, for the response to a step that ran out of memory."""
        r, job = self.runtime, self.job
        total, budget = self.step_memory.total, self.memory.budget
        return OutOfMemory(
            r.device, r.batch_size, r.grad_accum_steps, job.world_size, job.model.block_size, total, budget
        )
