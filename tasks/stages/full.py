"""The full training stage: the parameter file's `full` run (a fine-tune's `finetune` stage: from its
base), resumed from the run folder's latest checkpoint when an earlier attempt stopped."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gptcore.runtime.batch_size import BatchChoice
from gptcore.train.records import StartupRecord, SummaryRecord
from tasks.params.jobs import full_world_size
from tasks.prefect_progress import PrefectProgress
from tasks.results import CheckpointsResult, Figure, file_record
from tasks.stage import announce
from tasks.stages.smoke import SmokeResult
from tasks.stages.training import Training, run_directory

if TYPE_CHECKING:
    pass


class FullResult(CheckpointsResult):
    summary: SummaryRecord


@dataclass(frozen=True, kw_only=True)
class Full(Training[FullResult]):
    """Full training, its checkpoints in a run folder named by its key."""

    result_type = FullResult
    name: str = "full"  # a fine-tune's: finetune
    smoke: SmokeResult

    def key(self) -> tuple[Any, ...]:
        """With `batch_size: auto` the batch the smoke stage found is part of it."""
        batch = self.reused_batch()
        return self.training_key("full", batch=batch)

    def skip_reason(self) -> str | None:
        return self.params.full_refusal(self.device.runtime.device)

    def reused_batch(self) -> BatchChoice | None:
        """The smoke stage's `auto` batch, which full training trains with (None: configured)."""
        if self.params.runtime.batch_size != "auto" or not self.smoke.batch:
            return None
        return self.smoke.batch

    def compute(self, fingerprint: str | None) -> FullResult:
        from gptcore.checkpoint.files import latest_checkpoint, named_checkpoint

        params, smoke = self.params, self.smoke
        directory = run_directory(params, "full", fingerprint)
        resume_from = latest_checkpoint(directory)
        if resume_from is not None:
            announce(f"full: resuming from {resume_from}")
        planned = smoke.full_planned_steps or params.full.max_steps or 1
        progress = PrefectProgress(f"full-iteration-{params.iteration}", planned)
        callbacks = [progress, *self.callbacks]
        resume, nproc = resume_from is not None, full_world_size(params)
        summary = self.train("full", directory, callbacks, resume, nproc, self.reused_batch())
        final = named_checkpoint(directory, "final") or latest_checkpoint(directory)
        outputs = [path for path in (final, named_checkpoint(directory, "best")) if path is not None]
        return FullResult(
            fingerprint=fingerprint,
            run_directory=str(directory),
            summary=summary,
            files=file_record(*outputs),
            outputs=[str(path) for path in outputs],
            figures={
                **SummaryRecord.headline(summary),
                **smoke_estimate(smoke, resume),
                **trained_share(progress.startup),
                **sizes(progress.startup),
            },
        )


def trained_share(startup: StartupRecord | None) -> dict[str, Figure]:
    """What the optimizer trained (all but a fine-tune's frozen base): the count and its share."""
    share = startup.trained_share if startup is not None else None
    if startup is None or share is None:
        return {}
    return {
        "trainable_parameter_count": startup.trainable_parameter_count,
        "trainable_parameter_share": round(share, 6),
    }


def sizes(startup: StartupRecord | None) -> dict[str, Figure]:
    """The model's parameters, with and without the embeddings (a scaling study's N), and the tokens a
    step trains on."""
    if startup is None:
        return {}
    return {
        "parameter_count": startup.parameter_count,
        "non_embedding_parameter_count": startup.non_embedding_parameter_count,
        "tokens_per_step": startup.tokens_per_step,
    }


def smoke_estimate(smoke: SmokeResult, resumed: bool) -> dict[str, float]:
    """The smoke stage's estimate of this run, next to its `elapsed_seconds`; a resumed run's elapsed
    time is only its last part, so it gets none."""
    if resumed or not math.isfinite(smoke.estimated_full_seconds):
        return {}
    return {"estimated_full_seconds": round(smoke.estimated_full_seconds, 1)}
