"""What the smoke and full stages share (`Training`): their inputs, their MLflow callback, their cache
key, their run folder, and one training through `tasks.training_launch` holding the device's slot.

Both are keyed on the token files' fingerprint, the model, where its weights start, the decided runtime,
the stage's training settings and the code they reach. Full training writes into a run folder named by
that key, so a rerun after a failure finds its checkpoints there and resumes from the latest one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gptcore.errors import TrainingError
from gptcore.runtime.batch_size import BatchChoice
from gptcore.train.config import TrainingConfig
from gptcore.train.records import SummaryRecord
from tasks.caching import StageOutcome
from tasks.params.jobs import TrainingStart
from tasks.params.schema import PipelineParams, TrainingStage
from tasks.results import StageResult
from tasks.stage import Stage, announce
from tasks.stages.device import DeviceResult
from tasks.stages.tokens import SplitsResult

if TYPE_CHECKING:
    from gptcore.train.callbacks import TrainingCallback
    from tasks.tracking import PipelineRecorder

R = TypeVar("R", bound=StageResult)

# Runtime fields that change what training computes (threads and pinning do not).
_RUNTIME_KEYS = (
    "device",
    "precision",
    "batch_size",
    "grad_accum_steps",
    "batch_size_source",
    "effective_batch_target",
    "activation_checkpointing",
    "compile",
)


@dataclass(frozen=True, kw_only=True)
class Training(Stage[R]):
    """A stage that trains (smoke, full): from `start`, on the token files, with the device stage's
    decisions, recorded live into its stage run by the MLflow callback `run` hands it."""

    start: TrainingStart
    tokens: SplitsResult
    device: DeviceResult
    callbacks: tuple[TrainingCallback, ...] = ()  # the stage run's MLflow callback: not part of the key

    def run(self, tracking: PipelineRecorder) -> StageOutcome:
        """The stage, its training recorded into its stage run (a skipped one opens no callback)."""
        if self.skip_reason() is not None:
            return Stage.run(self, tracking)
        callbacks = tuple(tracking.training_callbacks(self.name, self.start.model))
        return Stage.run(replace(self, callbacks=callbacks), tracking)

    def training_key(
        self, stage: TrainingStage, schedule: TrainingConfig | None = None, batch: BatchChoice | None = None
    ) -> tuple[Any, ...]:
        """What decides a training's outcome besides code: a smoke record vouches for one machine (a
        different GPU or torch build needs its own), a full run for one device kind."""
        from gptcore.finetune.start import start_identity

        params, start, device = self.params, self.start, self.device
        runtime = {key: getattr(device.runtime, key) for key in _RUNTIME_KEYS}
        machine = {key: getattr(device.device, key) for key in ("device", "gpu_name", "torch_version")}
        tune = params.finetune
        # Where training starts: a start model by its content, with the adapters' settings.
        begins = start_identity(start.weights, tune.adapters() if tune else None) if start.weights else None
        return (
            stage,
            self.tokens.fingerprint,
            start.model.architecture.identity(),
            runtime,
            machine if stage == "smoke" else machine["device"],
            params.training_section(stage).identity(),
            schedule.identity() if schedule is not None else None,
            *([batch.batch_size, batch.grad_accum_steps] if batch else []),
            *([begins] if begins else []),
        )

    def train(
        self,
        stage: TrainingStage,
        directory: Path,
        callbacks: list[Any],
        resume: bool,
        nproc: int = 1,
        batch: BatchChoice | None = None,
    ) -> SummaryRecord:
        """One training of the stage (`tasks.training_launch`), in this process or on `nproc` local
        processes under torchrun, holding the device's slot (`tasks.device_slot`), with the device
        stage's decisions (its runtime; the smoke stage's `auto` batch); checkpoints go into `directory`."""
        from gptcore.distributed.torchrun import LaunchSpec
        from tasks.device_slot import device_slot
        from tasks.progress_bar import ProgressBar, wants_progress_bar
        from tasks.training_launch import launch_training

        params, tokens = self.params, self.tokens
        if wants_progress_bar():
            callbacks = [*callbacks, ProgressBar(f"{stage} iteration {params.iteration}")]
        with device_slot(self.device.runtime.device, nproc, announce):  # one training per device at a time
            summary = launch_training(
                params,
                stage,
                callbacks,
                LaunchSpec(nproc) if nproc > 1 else None,
                on_text=_logger().info,
                start=self.start,
                train_tokens=Path(tokens.train),
                validation_tokens=Path(tokens.validation),
                checkpoint_directory=directory,
                resume=resume,
                tokenizer=Path(tokens.tokenizer_path),
                extra_fingerprint={"tokens": tokens.fingerprint},
                batch=batch,  # the smoke stage's, with `batch_size: auto`
                decided=self.device.runtime,  # the device stage's decision is what the run trains with
            )
        if summary is None:  # one node, so rank 0's: only a run that reported nothing gets here
            raise TrainingError(f"{stage} training ended without a summary; see the run's logs")
        return summary


def run_directory(params: PipelineParams, stage: str, stage_fingerprint: str | None) -> Path:
    """`<checkpoint_root>/iteration-N-<stage>-<fingerprint>`; a fine-tune's stage as
    `finetune-<name>-<method>-<stage>`."""
    root = Path(params.paths.checkpoint_root).resolve()
    if params.finetune is not None:
        stage = f"finetune-{params.finetune.name}-{params.finetune.method}-{stage}"
    return root / f"iteration-{params.iteration}-{stage}-{stage_fingerprint}"


def _logger() -> Any:
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # outside a flow or task run: Prefect raises MissingContextError
        return logging.getLogger("gptpipe.training")
