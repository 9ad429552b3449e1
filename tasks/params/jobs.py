"""A parameter file's training stages as gptcore's `TrainJob`: the one place the pipeline's sections
become the engine's settings."""

from __future__ import annotations

from typing import Any

from gptcore.distributed.torchrun import resolve_nproc
from gptcore.errors import ConfigError
from gptcore.train.config import TrainingConfig
from gptcore.train.job import TrainJob
from tasks.params.schema import PipelineParams, TrainingStage


def full_world_size(params: PipelineParams) -> int:
    """The processes full training runs on (`runtime.nproc`, `auto` resolved on this machine)."""
    return resolve_nproc(params.runtime.nproc, params.runtime.device)


def train_job(params: PipelineParams, stage: TrainingStage = "full", **fields: Any) -> TrainJob:
    """A job for the `smoke` or `full` section of an iteration's parameters; a smoke job trains the full
    run's first steps (its optimizer, unless the smoke section names one, and schedule). A fine-tune's
    job starts from the base's weights, with adapters for LoRA; a continued pretraining's from
    `full.init_from`'s."""
    smoke = stage == "smoke"
    tune = params.finetune
    weights = params.start_weights()
    if params.start_model_key() is not None and weights is None:
        raise ConfigError(
            f"{params.start_model_key()}: not resolved to model files: the stage before training does it"
        )
    start = {"init_weights": weights, "lora": tune.adapters() if tune else None} if weights else {}
    return TrainJob(
        model=params.model_profile().architecture,
        runtime=params.runtime,
        training=TrainingConfig.of(params.training_section(stage)),
        device_defaults=params.defaults_for,
        follows=TrainingConfig.of(params.full) if smoke else None,
        follows_world_size=full_world_size(params) if smoke else None,
        **start,
        **fields,
    )
