"""A training job: everything one run needs, and how it is built from an iteration's parameters.

Setup (`gptcore.train.setup`), the trainer and a rank's entry point (`gptcore.train.multiprocess`) all
start from a job; none of them needs the trainer to know what a job holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptcore.config import (
    DeviceDefaults,
    LoRAConfig,
    ModelConfig,
    PipelineParams,
    RuntimeConfig,
    TrainingConfig,
)
from gptcore.data.tokenfile import TokenStream
from gptcore.errors import ConfigError
from gptcore.runtime.batch_size import BatchChoice
from gptcore.runtime.device import DefaultsSource
from gptcore.runtime.precision_speed import PrecisionSpeeds

TokenSource = Path | TokenStream
FALLBACK_DEFAULTS = DeviceDefaults(batch_size=8)  # a job that names no profile and no device defaults


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
    # The training section whose learning-rate schedule this run follows (its warmup and length); None:
    # its own. A smoke run follows the full run's, so its steps are the full run's first steps.
    follows: TrainingConfig | None = None
    follows_world_size: int | None = None  # the ranks the run it follows trains on; None: this run's
    batch: BatchChoice | None = None  # a batch decided before (the smoke stage's `auto`); None: decide
    # The device stage's precision probe, so `precision: auto` decides as that stage did; None: measure.
    precision_speeds: PrecisionSpeeds | None = None
    # Fine-tuning: the trained model's weights the run starts from (model files: gptcore.finetune.start),
    # and the low-rank adapters it trains on them instead of every weight.
    init_weights: Path | None = None
    lora: LoRAConfig | None = None

    @classmethod
    def from_params(cls, params: PipelineParams, stage: str = "full", **fields: Any) -> TrainJob:
        """A job for the `smoke` or `full` section of an iteration's parameters; a smoke job trains
        the full run's first steps (its optimizer, unless the smoke section names one, and schedule)."""
        smoke = stage == "smoke"
        tune = params.finetune  # a fine-tune starts from the base's weights, with adapters for LoRA
        if tune is not None and tune.weights is None:
            raise ConfigError("finetune.weights: unset: `gptpipe finetune` resolves finetune.model to it")
        start = {"init_weights": Path(tune.weights), "lora": tune.adapters()} if tune is not None else {}
        return cls(
            model=params.model.architecture,
            runtime=params.runtime,
            training=params.training_section("smoke" if smoke else "full"),
            device_defaults=params.defaults_for,
            follows=params.full if smoke else None,
            follows_world_size=_full_world_size(params) if smoke else None,
            **start,
            **fields,
        )

    @property
    def writes_checkpoints(self) -> bool:
        """Rank 0 of a real (not dry) run with a checkpoint folder writes the checkpoints."""
        return self.rank == 0 and not self.dry_run and self.checkpoint_directory is not None

    def defaults(self) -> DefaultsSource:
        """Batch size, precision and workers for a resolved device when the runtime leaves them unset."""
        if self.device_defaults is not None:
            return self.device_defaults
        return lambda device: (
            (self.runtime.gpu if device == "cuda" else self.runtime.cpu) or FALLBACK_DEFAULTS
        )


def _full_world_size(params: PipelineParams) -> int:
    """The processes full training runs on (`runtime.nproc`, `auto` resolved on this machine)."""
    from gptcore.distributed.torchrun import resolve_nproc

    return resolve_nproc(params.runtime.nproc, params.runtime.device)
