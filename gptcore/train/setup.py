"""A training run's setup from its job: seeds, data, batch, replicas, optimizer, step budget,
learning-rate schedule, guards, checkpoints, and the settings a resume must match. Plain functions of the
job and the runtime, so the trainer holds the run itself, not how it was assembled."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from gptcore.checkpoint.manager import Checkpointer, RunIdentity, TrainingParts
from gptcore.data.batches import ExampleSet, StepPlan, open_examples
from gptcore.data.tokenfile import MANIFEST_SUFFIX, TokenStream, read_manifest
from gptcore.distributed.group import agree_on_min, all_reduce_sum
from gptcore.errors import ConfigError, DataError
from gptcore.finetune.qlora import quantized_weights
from gptcore.finetune.start import start_identity
from gptcore.model.gpt import GPT, optimizer_groups
from gptcore.model.size import ModelSize
from gptcore.runtime.batch_size import (
    BatchChoice,
    accumulation,
    estimated_choice,
    memory_budget,
    probe_step,
    probed_choice,
)
from gptcore.runtime.decided import Runtime
from gptcore.runtime.memory import StepMemory
from gptcore.tools.records import Settings, flatten
from gptcore.train.config import BUDGET_FIELDS, TrainingConfig
from gptcore.train.guards import DivergenceGuard, NonFiniteGuard
from gptcore.train.job import TrainJob
from gptcore.train.muon import LR_SCALE, Muon, MuonWithAdamW, hidden_matrices, orthogonal_dtype
from gptcore.train.schedule import WarmupCosine


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def open_data(job: TrainJob, plan: StepPlan) -> tuple[ExampleSet | None, ExampleSet | None]:
    """The training and validation examples; none for a dry run without token files."""
    cfg, training = job.model, job.training
    if job.train_tokens is None:
        if not job.dry_run:
            raise ConfigError("--train-tokens: a training token file is required (or --dry-run)")
        return None, None
    train = open_examples(job.train_tokens, cfg.block_size, cfg.vocab_size, training.training_examples)
    if plan.steps_per_epoch(train.count) == 0:
        raise DataError(
            f"{train.stream.path}: {train.count} training examples fill no optimizer step of "
            f"{plan.global_batch} (batch {plan.batch_size} x accumulation "
            f"{plan.grad_accum_steps}); lower --batch-size/--grad-accum or add data"
        )
    validation = None
    if job.validation_tokens is not None:
        validation = open_examples(
            job.validation_tokens, cfg.block_size, cfg.vocab_size, training.validation_examples, "validation"
        )
    return train, validation


def data_parallel(
    model: torch.nn.Module, job: TrainJob, runtime: Runtime
) -> torch.nn.parallel.DistributedDataParallel | None:
    """DDP over the job's process group when there are several ranks: it starts every replica from
    rank 0's weights and averages gradients across ranks during backward."""
    if job.world_size == 1:
        return None
    if not torch.distributed.is_initialized():
        raise ConfigError(f"world size {job.world_size}: no process group; launch with --nproc (torchrun)")
    devices = [torch.cuda.current_device()] if runtime.device == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel
    ddp._set_params_and_buffers_to_ignore_for_model(model, quantized_weights(model))  # QLoRA's base
    return ddp(model, device_ids=devices)


def make_optimizer(
    model: torch.nn.Module, training: TrainingConfig, runtime: Runtime
) -> torch.optim.Optimizer:
    opt = training.optimizer
    muon = hidden_matrices(model) if opt.name == "muon" else set()
    groups = optimizer_groups(model, opt.weight_decay, exclude=muon)
    adamw = torch.optim.AdamW(
        groups,
        lr=opt.learning_rate,
        betas=(opt.beta1, opt.beta2),
        fused=runtime.fused_adamw,
        foreach=None if runtime.fused_adamw else True,
    )
    if not muon:
        return adamw
    matrices = [p for p in model.parameters() if id(p) in muon]
    scale = opt.muon_learning_rate / opt.learning_rate  # the schedule's rate is AdamW's
    orthogonal = Muon(
        [{"params": matrices, LR_SCALE: scale}],
        lr=opt.muon_learning_rate,
        weight_decay=opt.weight_decay,
        momentum=opt.muon_momentum,
        dtype=orthogonal_dtype(runtime.device),
    )
    return MuonWithAdamW(orthogonal, adamw)


def optimizer_state_bytes(model: torch.nn.Module, training: TrainingConfig) -> int:
    """The fp32 state `make_optimizer`'s optimizer keeps: two AdamW moments per parameter, one Muon
    momentum per entry of the matrices Muon trains."""
    muon = hidden_matrices(model) if training.optimizer.name == "muon" else set()
    return sum((4 if id(p) in muon else 8) * p.numel() for p in model.parameters())


def planned_steps(
    section: TrainingConfig, train_set: ExampleSet | None, plan: StepPlan, size: ModelSize
) -> int | None:
    """Optimizer steps a run of `section` takes over this data with `plan`'s global batch: its epochs,
    capped by max_steps and by its token budget at this model's `size` (max_tokens, max_flops,
    tokens_per_parameter: whole steps of global batch x block_size tokens)."""
    cap = section.max_steps
    if train_set is None:
        return cap
    budget = section.token_budget(size)
    if budget is not None:
        by_tokens = max(1, -(-budget // (plan.global_batch * train_set.block_size)))
        cap = min(cap or by_tokens, by_tokens)
    per_epoch = plan.steps_per_epoch(train_set.count_within(section.training_examples))
    return min(per_epoch * section.epochs, cap or per_epoch * section.epochs)


def warmup_cosine(
    job: TrainJob, train_set: ExampleSet | None, plan: StepPlan, size: ModelSize
) -> WarmupCosine:
    """Warmup then cosine decay over the planned steps of the run the job follows (its own, or for a
    smoke run the full run's, on that run's ranks), at the job's optimizer's rates."""
    section = job.follows or job.training
    if job.follows_world_size is not None:
        plan = StepPlan(plan.batch_size, plan.grad_accum_steps, job.follows_world_size, 0)
    opt, total = job.training.optimizer, planned_steps(section, train_set, plan, size) or 1
    return WarmupCosine(opt.learning_rate, opt.min_learning_rate, opt.warmup_for(total), total)


def trajectory_settings(
    job: TrainJob, train_set: ExampleSet | None, plan: StepPlan, runtime: Runtime
) -> Settings:
    """What determines the training trajectory, flat: a resume must match it exactly. Per-device batch
    and accumulation may change as long as the global batch stays (after an OOM, on more ranks)."""
    t = job.training
    config: Settings = {}
    flatten("model", job.model.identity(), config)  # a GPT-2 model's, as before the recipe's fields
    flatten("optimizer", t.optimizer.identity(), config)  # AdamW's: as before Muon could be chosen
    config.update(
        {
            "training.seed": t.seed,
            "training.epochs": t.epochs,
            "training.max_steps": t.max_steps,
            "training.training_examples": train_set.count if train_set else None,
            "global_batch": plan.global_batch,
            "precision": runtime.precision,
            "data.train_tokens": _stream_identity(job.train_tokens),
        }
    )
    for budget in ("max_tokens", *BUDGET_FIELDS):  # only when set: runs from before them keep resuming
        if getattr(t, budget) is not None:
            config[f"training.{budget}"] = getattr(t, budget)
    flatten("data", job.extra_fingerprint, config)
    config.update(start_identity(job.init_weights, job.lora))  # fine-tuning only: others keep resuming
    return json.loads(json.dumps(config, default=str))  # as the JSON sidecar will hold it


def _stream_identity(source: Path | TokenStream | None) -> str | None:
    if source is None:
        return None
    if isinstance(source, TokenStream):
        return source.manifest.sha256 if source.manifest else f"{source.path.name}:{len(source)} tokens"
    manifest = read_manifest(source) if Path(source).name.endswith(MANIFEST_SUFFIX) else None
    if manifest is not None:  # a sharded split: its shards' hashes, not the manifest's size
        return f"{Path(source).name}:{manifest.sha256}"
    return f"{Path(source).name}:{Path(source).stat().st_size} bytes"


def choose_batch(job: TrainJob, runtime: Runtime, model: GPT, memory: StepMemory, held: int) -> BatchChoice:
    """The batch this run trains with: one decided before (the smoke stage's, for full training), the
    configured one, or with `batch_size: auto` the largest that fits (probed on CUDA, estimated
    elsewhere from `memory`), the same on every rank. `held`: bytes the run holds already (its weights)."""
    effective, configured_accum = runtime.effective_batch_target, runtime.grad_accum_steps
    if job.batch is not None:  # its accumulation follows this run's ranks
        accum = accumulation(effective, job.batch.batch_size, job.world_size, job.batch.grad_accum_steps)
        return replace(job.batch, grad_accum_steps=accum)
    if runtime.batch_size_source != "auto":
        accum = accumulation(effective, runtime.batch_size, job.world_size, configured_accum)
        return BatchChoice(runtime.batch_size, accum, "configured")
    parameters = model.parameter_count()
    if runtime.device == "cuda":
        # AdamW's moments and, when accumulating, the gradients of the earlier micro-batches.
        reserve = 8 * parameters + (4 * parameters if configured_accum > 1 or effective else 0)
        step = probe_step(model, job.model, runtime.device, runtime.autocast, reserve)
        choice = probed_choice(step, effective, job.world_size, configured_accum)
    else:
        budget = memory_budget(runtime.device, held)
        choice = estimated_choice(memory, budget, effective, job.world_size, configured_accum)
    size = agree_on_min(choice.batch_size, runtime.device)  # every rank trains the same batch
    accum = accumulation(effective, size, job.world_size, configured_accum)
    return replace(choice, batch_size=size, grad_accum_steps=accum)


def make_guards(
    job: TrainJob, runtime: Runtime, scaler: torch.amp.GradScaler, schedule: WarmupCosine
) -> tuple[NonFiniteGuard, DivergenceGuard]:
    """The guards that stop a run: non-finite steps (every rank agreeing), and divergence. A run that is
    another's first steps (a smoke run) is judged by its gate instead, on all its figures."""
    nonfinite = NonFiniteGuard(
        runtime.precision,
        scaler.get_scale if scaler.is_enabled() else None,
        job.training.max_skipped_steps,
        immediate=runtime.device != "cuda",  # on CUDA read one step late, keeping the queue full
        agree=all_reduce_sum,
    )
    divergence = DivergenceGuard(
        job.model, schedule.warmup_steps, schedule.peak, runtime.precision, enabled=job.follows is None
    )
    return nonfinite, divergence


def make_checkpointer(
    job: TrainJob, parts: TrainingParts, trajectory: Settings, fingerprint: str
) -> Checkpointer:
    """The run's checkpoints: written by rank 0 of a real run, each naming what a resume must match."""
    t = job.training
    tokenizer = str(Path(job.tokenizer).resolve()) if job.tokenizer is not None else None
    identity = RunIdentity(trajectory, fingerprint, job.model, job.metadata, tokenizer)
    return Checkpointer(
        job.checkpoint_directory,
        t.checkpoint_every,
        t.keep_last,
        writes=job.writes_checkpoints,
        parts=parts,
        background=t.async_checkpoints,
        identity=identity,
    )
