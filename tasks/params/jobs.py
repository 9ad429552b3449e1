"""A parameter file's training stages as gptcore's `TrainJob`: the one place the pipeline's sections
become the engine's settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptcore.distributed.torchrun import resolve_nproc
from gptcore.errors import ConfigError
from gptcore.runtime.config import ConcreteDevice, DeviceDefaults
from gptcore.train.config import TrainingConfig
from gptcore.train.job import TrainJob
from tasks.params.schema import ModelProfile, PipelineParams, TrainingStage


@dataclass(frozen=True)
class TrainingStart:
    """What a run's training builds and where its weights begin: the parameter file's model from random
    weights, or a start model's own architecture and its kept files (a fine-tune's base, `full.init_from`'s
    model), as the stage that resolved it hands it on. Never written back into the parameter file."""

    model: ModelProfile
    weights: Path | None = None  # the start model's kept files; None: random initial weights

    @classmethod
    def scratch(cls, params: PipelineParams) -> TrainingStart:
        """A run from random weights: the file's own model; a file whose training starts from a model
        that no stage resolved here is refused (`PipelineParams.model_profile`)."""
        key = params.start_model_key()
        if key is not None:
            raise ConfigError(f"{key}: not resolved to model files: the stage before training does it")
        return cls(params.model_profile())

    def device_defaults(self, params: PipelineParams) -> Callable[[ConcreteDevice], DeviceDefaults]:
        """The runtime defaults for a resolved device: the parameter file's, else this model profile's."""
        return lambda device: params.defaults_for(device, self.model)


def full_world_size(params: PipelineParams) -> int:
    """The processes full training runs on (`runtime.nproc`, `auto` resolved on this machine)."""
    return resolve_nproc(params.runtime.nproc, params.runtime.device)


def train_job(
    params: PipelineParams, stage: TrainingStage = "full", start: TrainingStart | None = None, **fields: Any
) -> TrainJob:
    """A job for the `smoke` or `full` section of an iteration's parameters; a smoke job trains the full
    run's first steps (its optimizer, unless the smoke section names one, and schedule). A fine-tune's
    job starts from the base's weights, with adapters for LoRA; a continued pretraining's from
    `full.init_from`'s (`start`, as the stage before training resolved it; None: random weights)."""
    smoke = stage == "smoke"
    start = start or TrainingStart.scratch(params)
    tune = params.finetune
    weights = {"init_weights": start.weights, "lora": tune.adapters() if tune else None}
    return TrainJob(
        model=start.model.architecture,
        runtime=params.runtime,
        training=TrainingConfig.of(params.training_section(stage)),
        device_defaults=start.device_defaults(params),
        follows=TrainingConfig.of(params.full) if smoke else None,
        follows_world_size=full_world_size(params) if smoke else None,
        **(weights if start.weights is not None else {}),
        **fields,
    )
