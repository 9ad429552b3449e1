"""A training job: everything one run needs (the pipeline builds one from a parameter file:
`tasks.params.jobs`).

Setup (`gptcore.train.setup`), the trainer and a rank's entry point (`gptcore.train.multiprocess`) all
start from a job; none of them needs the trainer to know what a job holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptcore.data.tokenfile import TokenStream
from gptcore.finetune.config import LoRAConfig
from gptcore.model.config import ModelConfig
from gptcore.runtime.batch_size import BatchChoice
from gptcore.runtime.config import DeviceDefaults, RuntimeConfig
from gptcore.runtime.decided import Runtime
from gptcore.runtime.device import DefaultsSource, resolve_runtime
from gptcore.train.config import TrainingConfig

TokenSource = Path | TokenStream
FALLBACK_DEFAULTS = DeviceDefaults(batch_size=8)  # a job that names no profile and no device defaults


@dataclass(frozen=True)
class TrainJob:
    """Everything one training run needs. `device_defaults` supplies batch size, precision and workers
    for the resolved device when the runtime request leaves them unset (a table with `cpu` and
    `gpu` defaults, such as a model profile, or a callable)."""

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
    # What else decides the run, as the pipeline names it (its data's fingerprints: free-form, nested),
    # recorded flat under `data.` in what a resume must match.
    extra_fingerprint: dict[str, Any] = field(default_factory=dict)
    # Written into every checkpoint's record as it is then (the MLflow callback adds its run id): text.
    metadata: dict[str, str] = field(default_factory=dict)
    world_size: int = 1  # data-parallel ranks, each a process in an initialised group (torchrun)
    rank: int = 0
    # The training section whose learning-rate schedule this run follows (its warmup and length); None:
    # its own. A smoke run follows the full run's, so its steps are the full run's first steps.
    follows: TrainingConfig | None = None
    follows_world_size: int | None = None  # the ranks the run it follows trains on; None: this run's
    batch: BatchChoice | None = None  # a batch decided before (the smoke stage's `auto`); None: decide
    # The runtime decided before (the pipeline's device stage): what the run trains with; None: the
    # trainer resolves `runtime` itself.
    decided: Runtime | None = None
    # Fine-tuning: the trained model's weights the run starts from (model files: gptcore.finetune.start),
    # and the low-rank adapters it trains on them instead of every weight.
    init_weights: Path | None = None
    lora: LoRAConfig | None = None

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

    def decide_runtime(self) -> Runtime:
        """The runtime the run trains with: the one decided before, with this process's own facts
        (threads, heap), or else `runtime` resolved here."""
        if self.decided is not None:
            return self.decided.in_this_process()
        return resolve_runtime(self.runtime, self.defaults())
