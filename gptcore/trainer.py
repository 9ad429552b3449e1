"""The trainer: one `TrainJob` in, a summary dict out, progress through `TrainingCallback`s.

The trainer prints nothing: the CLI installs `gptcore.console.JsonLinesCallback` for its JSON lines, the
pipeline its MLflow adapter. Host synchronisation (`.item()`) happens only at log intervals,
evaluations and checkpoints, so CUDA keeps its queue full between them.

Exact resume: the data order of any step is a function of (seed, epoch, step in epoch), and a
checkpoint holds model, optimizer, schedule, scaler and every RNG state, so a resumed run replays the
uninterrupted one (bit for bit on CPU in fp32). A resume whose trajectory-determining config differs
from the checkpoint's is refused with the differing keys.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gptcore import checkpoint as ckpt
from gptcore.callbacks import TrainingCallback
from gptcore.config import ModelConfig, PipelineParams, RuntimeConfig, TrainingConfig
from gptcore.distributed import agree_on_int, all_reduce_mean, all_reduce_sum, grad_scaler, rank_range
from gptcore.errors import CheckpointError, ConfigError, DataError, GptpipeError, TrainingError
from gptcore.examples import BatchLoader, ExampleSet, StepPlan, epoch_order, open_examples, unigram_loss
from gptcore.fingerprint import code_version, fingerprint
from gptcore.guards import DivergenceGuard, NonFiniteGuard
from gptcore.measure import (
    FLOP_FORMULA,
    Throughput,
    estimate_memory,
    flops_per_token,
    mfu,
    model_matmul_shapes,
    peak_flops,
    peak_memory_bytes,
    reset_peak_memory,
)
from gptcore.model import GPT, optimizer_groups
from gptcore.run_lock import RunLock
from gptcore.runtime import DefaultsSource, Runtime, apply_runtime, device_report, resolve_runtime
from gptcore.schedule import WarmupCosine
from gptcore.tokenfile import TokenStream

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
            **fields,
        )


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


def _defaults_source(job: TrainJob) -> DefaultsSource:
    if job.device_defaults is not None:
        return job.device_defaults
    from gptcore.config import DeviceDefaults

    fallback = DeviceDefaults(batch_size=8)
    return lambda device: (job.runtime.gpu if device == "cuda" else job.runtime.cpu) or fallback


def _flatten(prefix: str, value: Any, into: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), item, into)
    else:
        into[prefix] = value


def _stream_identity(source: TokenSource | None) -> str | None:
    if source is None:
        return None
    if isinstance(source, TokenStream):
        return source.manifest.sha256 if source.manifest else f"{source.path.name}:{len(source)} tokens"
    return f"{Path(source).name}:{Path(source).stat().st_size} bytes"


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


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
                _, loss = forward(x, y)
            scaler.scale(loss / accum).backward()
        total = loss.detach() if total is None else total + loss.detach()
    return total


class _Run:
    def __init__(self, job: TrainJob, events: TrainingCallback) -> None:
        self.job = job
        self.events = events
        self.training = job.training
        self.runtime: Runtime = resolve_runtime(job.runtime, _defaults_source(job))
        apply_runtime(self.runtime)
        self.plan = StepPlan(self.runtime.batch_size, self.runtime.grad_accum_steps, job.world_size, job.rank)
        self.train_set, self.val_set = self._open_data()
        self._seed(self.training.seed)
        self.model = GPT(job.model).to(self.runtime.device)
        self.ddp = self._data_parallel()
        replica = self.ddp or self.model
        self.forward = torch.compile(replica) if self.runtime.compile else replica
        self.optimizer = self._optimizer()
        self.planned_steps = self._planned_steps(self.training)
        self.schedule = self._schedule(job.schedule or self.training)
        self.scaler = grad_scaler(self.runtime.device, self.runtime.uses_grad_scaler, job.world_size)
        self.guard = NonFiniteGuard(
            self.runtime.precision,
            self.scaler.is_enabled(),
            self.training.max_skipped_steps,
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
        self.config = self._resume_config()
        self.fingerprint = fingerprint(self.config)
        self.step = 0
        self.best_val_loss: float | None = None
        self.resumed_from: Path | None = None
        self.save_seconds = 0.0
        self.saved: dict[str, str] = {}
        self.last_train_loss: float | None = None
        self.last_val_loss: float | None = None
        self.unigram: float | None = None
        self.tokens_per_step = self.plan.global_batch * job.model.block_size

    # --- setup ------------------------------------------------------------------------------------

    @staticmethod
    def _seed(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    def _open_data(self) -> tuple[ExampleSet | None, ExampleSet | None]:
        job, cfg = self.job, self.job.model
        if job.train_tokens is None:
            if not job.dry_run:
                raise ConfigError("--train-tokens: a training token file is required (or --dry-run)")
            return None, None
        train = open_examples(
            job.train_tokens, cfg.block_size, cfg.vocab_size, self.training.training_examples
        )
        if self.plan.steps_per_epoch(train.count) == 0:
            raise DataError(
                f"{train.stream.path}: {train.count} training examples fill no optimizer step of "
                f"{self.plan.global_batch} (batch {self.plan.batch_size} x accumulation "
                f"{self.plan.grad_accum_steps}); lower --batch-size/--grad-accum or add data"
            )
        validation = None
        if job.validation_tokens is not None:
            validation = open_examples(
                job.validation_tokens,
                cfg.block_size,
                cfg.vocab_size,
                self.training.validation_examples,
                "validation",
            )
        return train, validation

    def _data_parallel(self) -> torch.nn.parallel.DistributedDataParallel | None:
        """DDP over the job's process group when there are several ranks: it starts every replica from
        rank 0's weights and averages gradients across ranks during backward."""
        if self.job.world_size == 1:
            return None
        if not torch.distributed.is_initialized():
            raise ConfigError(
                f"world size {self.job.world_size}: no process group; launch with --nproc (torchrun)"
            )
        cuda = self.runtime.device == "cuda"
        devices = [torch.cuda.current_device()] if cuda else None
        return torch.nn.parallel.DistributedDataParallel(self.model, device_ids=devices)

    def _optimizer(self) -> torch.optim.Optimizer:
        opt = self.training.optimizer
        return torch.optim.AdamW(
            optimizer_groups(self.model, opt.weight_decay),
            lr=opt.learning_rate,
            betas=(opt.beta1, opt.beta2),
            fused=self.runtime.fused_adamw,
            foreach=None if self.runtime.fused_adamw else True,
        )

    def _planned_steps(self, section: TrainingConfig) -> int | None:
        """Optimizer steps a run of `section` takes over this data: its epochs, capped by max_steps."""
        cap = section.max_steps
        if self.train_set is None:
            return cap
        per_epoch = self.plan.steps_per_epoch(self.train_set.count_within(section.training_examples))
        return min(per_epoch * section.epochs, cap or per_epoch * section.epochs)

    def _schedule(self, section: TrainingConfig) -> WarmupCosine:
        """Warmup then cosine decay over the planned steps of `section` (this run's, or the run it is the
        first steps of), at this run's optimizer's rates."""
        opt, total = self.training.optimizer, self._planned_steps(section) or 1
        warmup = min(opt.warmup_steps, max(0, total - 1))
        return WarmupCosine(opt.learning_rate, opt.min_learning_rate, warmup, total)

    def _resume_config(self) -> dict[str, Any]:
        """What determines the training trajectory: a resume must match it exactly. Per-device batch
        and accumulation may change as long as the global batch stays (after an OOM, on more ranks)."""
        t = self.training
        config: dict[str, Any] = {}
        _flatten("model", self.job.model.model_dump(), config)
        _flatten("optimizer", t.optimizer.model_dump(), config)
        config.update(
            {
                "training.seed": t.seed,
                "training.epochs": t.epochs,
                "training.max_steps": t.max_steps,
                "training.training_examples": self.train_set.count if self.train_set else None,
                "global_batch": self.plan.global_batch,
                "precision": self.runtime.precision,
                "data.train_tokens": _stream_identity(self.job.train_tokens),
            }
        )
        _flatten("data", self.job.extra_fingerprint, config)
        return json.loads(json.dumps(config, default=str))  # as the JSON sidecar will hold it

    # --- records ----------------------------------------------------------------------------------

    def startup_record(self) -> dict[str, Any]:
        cfg, runtime = self.job.model, self.runtime
        report = device_report(runtime.device)
        estimate = estimate_memory(cfg, self.model.parameter_count(), runtime.batch_size, runtime.precision)
        self.flops_token = flops_per_token(cfg, self.model.matmul_parameter_count())
        shapes = model_matmul_shapes(cfg, runtime.batch_size * cfg.block_size)
        self.peak, self.peak_source = peak_flops(
            runtime.device, runtime.precision, runtime.tf32_enabled, shapes, seconds=0.1
        )
        if self.job.world_size > 1:  # tokens/s are the whole job's: divide by every rank's peak
            self.peak *= self.job.world_size
            self.peak_source = f"{self.peak_source} x {self.job.world_size} ranks"
        self.estimate = estimate
        per_epoch = self.plan.steps_per_epoch(self.train_set.count) if self.train_set else None
        return {
            "event": "startup",
            **{k: report[k] for k in ("processor", "gpu_name", "gpu_memory_bytes", "torch_version")},
            "cuda_available": report["cuda_available"],
            **runtime.to_dict(),
            "sequence_length": cfg.block_size,
            "parameter_count": self.model.parameter_count(),
            "matmul_parameter_count": self.model.matmul_parameter_count(),
            "max_steps": self.training.max_steps,
            "epochs": self.training.epochs,
            "planned_steps": self.planned_steps,
            "schedule_steps": self.schedule.total_steps,  # the full run's, for a smoke run
            "warmup_steps": self.schedule.warmup_steps,
            "tokens_per_step": self.tokens_per_step,
            "planned_tokens": self.planned_steps * self.tokens_per_step if self.planned_steps else None,
            "train_examples": self.train_set.count if self.train_set else None,
            "validation_examples": self.val_set.count if self.val_set else None,
            "steps_per_epoch": per_epoch,
            "estimated_peak_memory_bytes": estimate["total"],
            "estimated_memory": estimate,
            "flops_per_token": self.flops_token,
            "flop_formula": FLOP_FORMULA,
            "peak_flops": self.peak,
            "peak_flops_source": self.peak_source,
            "checkpoint_directory": str(self.job.checkpoint_directory)
            if self.job.checkpoint_directory
            else None,
            "world_size": self.job.world_size,
            "per_rank_batch_size": self.plan.batch_size,
            "global_batch": self.plan.global_batch,
            "start_step": self.step,
            "resumed_from": str(self.resumed_from) if self.resumed_from else None,
            "fingerprint": self.fingerprint,
            "dry_run": self.job.dry_run,
        }

    def summary(self, meter: Throughput | None, started: float) -> dict[str, Any]:
        steps_per_second = meter.steps_per_second if meter else 0.0
        tokens_per_second = meter.tokens_per_second if meter else 0.0
        planned = self.planned_steps or 0
        return {
            "event": "summary",
            "steps": self.step,
            "planned_steps": self.planned_steps,
            "tokens_per_second": tokens_per_second,
            "steps_per_second": steps_per_second,
            "mfu": mfu(tokens_per_second, self.flops_token, self.peak),
            "peak_flops": self.peak,
            "peak_memory_bytes": peak_memory_bytes(self.runtime.device),
            "estimated_peak_memory_bytes": self.estimate["total"],
            "final_train_loss": self.last_train_loss,
            "final_val_loss": self.last_val_loss,
            "best_val_loss": self.best_val_loss,
            "unigram_val_loss": self.unigram,
            "elapsed_seconds": time.perf_counter() - started,
            "estimated_total_seconds": planned / steps_per_second if steps_per_second > 0 else None,
            "checkpoint_save_seconds": self.save_seconds,
            "final_checkpoint": self.saved.get("final"),
            "best_checkpoint": self.saved.get("best"),
            "latest_checkpoint": self.saved.get("latest"),
            "dry_run": self.job.dry_run,
        }

    # --- resume and checkpoints -------------------------------------------------------------------

    def restore(self) -> None:
        found = ckpt.load_latest_valid(self.job.checkpoint_directory)
        if found is None:
            log.warning(
                "warning: --resume: no checkpoint in %s yet; starting from step 0",
                self.job.checkpoint_directory,
            )
            return  # the startup line shows start_step 0 and resumed_from null
        path, stored, state = found
        differences = ckpt.config_differences(stored.get("config", {}), self.config)
        if differences:
            raise CheckpointError(
                f"--resume: {path} was written with a different configuration: " + "; ".join(differences)
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        ckpt.restore_rng(state["rng"])
        self.step = agree_on_int(int(state["step"]), "the resume step", self.runtime.device)
        self.best_val_loss = state["best_val_loss"]
        self.resumed_from = path

    def save(self, kind: str) -> None:
        directory = self.job.checkpoint_directory
        if directory is None or self.job.rank != 0:
            return  # replicas are identical: rank 0 writes the one checkpoint
        per_epoch = self.plan.steps_per_epoch(self.train_set.count)
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedule.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": self.step,
            "epoch": self.step // per_epoch,
            "position": (self.step % per_epoch)
            * self.plan.global_batch,  # examples of the epoch's order used
            "rng": ckpt.capture_rng(),
            "best_val_loss": self.best_val_loss,
            "fingerprint": self.fingerprint,
        }
        metadata = dict(self.job.metadata)
        if self.job.tokenizer is not None:
            metadata.setdefault("tokenizer", str(Path(self.job.tokenizer).resolve()))
        record = {
            "kind": kind,
            "step": self.step,
            "epoch": state["epoch"],
            "position": state["position"],
            "fingerprint": self.fingerprint,
            "config": self.config,
            "model_config": self.job.model.model_dump(),
            "metadata": metadata,
            "train_loss": self.last_train_loss,
            "val_loss": self.last_val_loss,
            "code_version": code_version(),
        }
        name = ckpt.step_name(self.step) if kind == "step" else kind
        keep = self.training.keep_last if kind == "step" else None
        path, seconds = ckpt.save_checkpoint(Path(directory), name, state, record, keep)
        self.save_seconds += seconds
        self.saved["latest" if kind == "step" else kind] = str(path)
        if kind != "best":
            self.guard.last_checkpoint = str(path)
        self.events.on_checkpoint(path, {"step": self.step, "kind": kind, "seconds": seconds})

    # --- evaluation -------------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self) -> None:
        if self.val_set is None:
            return
        self.model.eval()
        loader = BatchLoader(self.val_set, self.runtime.device, self.runtime.pin_memory, 0)
        batch = self.runtime.batch_size
        share = rank_range(self.val_set.count, self.job.world_size, self.job.rank)  # each rank its part
        indices = (np.arange(s, min(s + batch, share.stop)) for s in range(share.start, share.stop, batch))
        total = torch.zeros((), device=self.runtime.device, dtype=torch.float64)
        for x, y in loader.batches(indices):
            with self.runtime.autocast():
                _, loss = self.model(x, y)
            total += loss.double() * x.shape[0]
        self.model.train()
        self.last_val_loss = float(all_reduce_sum(total).item()) / self.val_set.count
        metrics: dict[str, Any] = {
            "step": self.step,
            "val_loss": self.last_val_loss,
            "val_perplexity": math.exp(min(self.last_val_loss, 700.0)),
        }
        if self.unigram is None:
            self.unigram = unigram_loss(self.train_set, self.val_set, self.job.model.vocab_size)
            metrics["unigram_val_loss"] = self.unigram
        self.events.on_eval(metrics)
        self.divergence.check(self.step, self.last_val_loss, self.guard.last_checkpoint)
        if self.step == 0:
            return  # the untrained model is nobody's best checkpoint
        if self.best_val_loss is None or self.last_val_loss < self.best_val_loss:
            self.best_val_loss = self.last_val_loss
            self.save("best")

    # --- the loop ---------------------------------------------------------------------------------

    def _micro_batch_indices(self) -> Iterator[np.ndarray]:
        per_epoch = self.plan.steps_per_epoch(self.train_set.count)
        order_of: tuple[int, np.ndarray] | None = None
        for step in range(self.step, self.planned_steps):
            epoch, position = divmod(step, per_epoch)
            if order_of is None or order_of[0] != epoch:
                order_of = (epoch, epoch_order(self.train_set.count, self.training.seed, epoch))
            yield from self.plan.micro_batches(order_of[1], position)

    def _grad_norm(self, clip: float) -> torch.Tensor:
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        return torch.nn.utils.clip_grad_norm_(parameters, clip if clip > 0 else float("inf"), foreach=True)

    def _log(self, meter: Throughput, loss_sum: torch.Tensor, steps: int, grad_norm: torch.Tensor) -> None:
        mean_over_ranks = all_reduce_mean(loss_sum)  # every rank gets the same value: they stop together
        self.last_train_loss = float(mean_over_ranks.item()) / (steps * self.plan.grad_accum_steps)
        if not math.isfinite(self.last_train_loss):
            raise TrainingError(
                f"training loss is {self.last_train_loss} at step {self.step}; stopped (the last checkpoint "
                "is kept): lower the learning rate or use --precision bf16/fp32"
            )
        steps_per_second, tokens_per_second = meter.take_interval()
        self.events.on_step(
            {
                "step": self.step,
                "train_loss": self.last_train_loss,
                "learning_rate": self.schedule.rate(self.step - 1),
                "grad_norm": float(grad_norm.item()),
                "tokens_per_second": tokens_per_second,
                "steps_per_second": steps_per_second,
                "mfu": mfu(tokens_per_second, self.flops_token, self.peak),
                "epoch": (self.step - 1) // self.plan.steps_per_epoch(self.train_set.count),
            }
        )

    def train_steps(self, meter: Throughput) -> None:
        t, accum = self.training, self.plan.grad_accum_steps
        loader = BatchLoader(
            self.train_set, self.runtime.device, self.runtime.pin_memory, self.runtime.workers
        )
        batches = loader.batches(self._micro_batch_indices())
        loss_sum = torch.zeros((), device=self.runtime.device)
        interval = 0
        meter.start()
        try:
            while self.step < self.planned_steps:
                self.schedule.apply(self.optimizer, self.step)
                step_loss = accumulate_gradients(
                    self.forward, batches, accum, self.runtime, self.scaler, self.ddp and self.ddp.no_sync
                )
                self.scaler.unscale_(self.optimizer)
                logging = (self.step + 1) % t.log_every == 0 or self.step + 1 == self.planned_steps
                needs_norm = t.optimizer.grad_clip > 0 or logging or not self.guard.uses_grad_scaler
                grad_norm = self._grad_norm(t.optimizer.grad_clip) if needs_norm else None
                scale_before = self.scaler.get_scale() if self.guard.uses_grad_scaler else 0.0
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.optimizer.zero_grad(set_to_none=True)
                self.step += 1
                meter.step_done()
                self.guard.observe(self.step, step_loss, grad_norm)
                scale_after = self.scaler.get_scale() if self.guard.uses_grad_scaler else 0.0
                if self.guard.scaler_step_taken(self.step, scale_before, scale_after):
                    loss_sum += step_loss  # a step the fp16 scaler skipped has no loss worth averaging
                    interval += 1
                if logging and interval:
                    self._log(meter, loss_sum, interval, grad_norm)
                    loss_sum.zero_()
                    interval = 0
                self._between_steps(meter)
            self.guard.settle()
        finally:
            loader.close()

    def _between_steps(self, meter: Throughput) -> None:
        """Evaluation and periodic checkpoints, outside the throughput clock."""
        t, interrupted = self.training, False
        if self.step < self.planned_steps and (
            self.step % t.eval_every == 0 or self.step % t.checkpoint_every == 0
        ):
            self.guard.settle()  # never evaluate or checkpoint weights a non-finite step touched
        if self.step % t.eval_every == 0 and self.step < self.planned_steps:
            self.evaluate()
            interrupted = True
        if self.step % t.checkpoint_every == 0 and self.step < self.planned_steps:
            self.save("step")
            interrupted = True
        if interrupted:
            meter.start()

    def execute(self) -> dict[str, Any]:
        """The run, holding its checkpoint directory's lock (rank 0; a dry run writes nothing)."""
        directory = self.job.checkpoint_directory
        if directory is None or self.job.dry_run or self.job.rank != 0:
            return self._execute()
        with RunLock(directory):
            ckpt.remove_stale_temporaries(directory)  # a killed run's half-written files
            return self._execute()

    def _execute(self) -> dict[str, Any]:
        started = time.perf_counter()
        if self.job.resume and not self.job.dry_run:
            self.restore()
        self.events.on_start(self.startup_record())
        if self.job.dry_run:
            summary = self.summary(None, started)
            self.events.on_end(summary)
            return summary
        reset_peak_memory(self.runtime.device)
        meter = Throughput(self.tokens_per_step)
        try:
            if self.training.eval_at_start and self.step == 0:
                self.evaluate()  # the untrained baseline that later evaluations are judged by
            self.train_steps(meter)
        except (torch.OutOfMemoryError, RuntimeError) as error:
            if not is_out_of_memory(error):
                raise
            raise TrainingError(self._oom_advice()) from None
        self.evaluate()
        self.save("final")
        summary = self.summary(meter, started)
        self.events.on_end(summary)
        return summary

    def _oom_advice(self) -> str:
        if self.runtime.device == "cuda":
            torch.cuda.empty_cache()
        batch, accum = self.runtime.batch_size, self.runtime.grad_accum_steps
        last = ckpt.latest_checkpoint(self.job.checkpoint_directory)
        kept = f"the last checkpoint {last} is kept: add --resume to continue from it, or use a fresh "
        return (
            f"out of memory on {self.runtime.device} at batch size {batch} (estimated peak "
            f"{self.estimate['total'] / 2**30:.1f} GiB): rerun with --batch-size {max(1, batch // 2)} "
            f"--grad-accum {accum * 2} to keep the effective batch of {self.plan.global_batch}; "
            + (kept + "--checkpoint-directory" if last else "no checkpoint had been written yet")
        )
