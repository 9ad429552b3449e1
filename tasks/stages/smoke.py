"""The smoke stage: the full run's first steps, bounded, gating full training (finite losses, train loss
falling, validation loss not rising and below the uniform guess, memory that fits), measuring the
machine and estimating the full run's time; its `auto` batch is the one full training trains with."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gptcore.data.batches import examples_in
from gptcore.errors import TrainingError
from gptcore.runtime.batch_size import BatchChoice
from gptcore.tools.atomic import write_json_atomic
from gptcore.train.estimate import RunPlan, estimate_run
from gptcore.train.records import StartupRecord, SummaryRecord
from tasks.caching import StageOutcome
from tasks.params.jobs import full_world_size
from tasks.prefect_progress import PrefectProgress
from tasks.results import Figure, Record, StageResult, file_record
from tasks.stage import announce
from tasks.stages.smoke_gate import DataSizing, GateResult, judge, memory_limit
from tasks.stages.training import Training, run_directory

if TYPE_CHECKING:
    from tasks.tracking import PipelineRecorder

SMOKE_RECORD = "smoke.json"


class FullSchedule(BaseModel):
    """The full run's schedule the smoke run followed."""

    model_config = ConfigDict(frozen=True)

    steps: int
    warmup_steps: int


class SmokeResult(StageResult):
    gate: Record[GateResult]
    optimizer: dict[str, Figure | list[float]]  # the settings it trained with, and their `source`
    schedule: FullSchedule
    precision: str
    val_losses: list[float]
    summary: SummaryRecord  # the trainer's
    full_planned_steps: int
    estimated_full_seconds: float
    estimate: dict[str, float] | None = None  # gptcore.train.estimate.RunTimeEstimate.figures(): its parts
    data_sizing: dict[str, Figure] = Field(default_factory=dict)  # DataSizing's figures and its warning
    # The batch it trained with: full training reuses it (`batch_size: auto`).
    batch: BatchChoice | None = None

    @field_validator("batch", mode="before")
    @classmethod
    def _none_when_empty(cls, value: Any) -> Any:
        return value or None


@dataclass(frozen=True, kw_only=True)
class Smoke(Training[SmokeResult]):
    """The full run's first steps on this machine, judged before full training may start."""

    result_type = SmokeResult
    name: str = "smoke"

    def key(self) -> tuple[Any, ...]:
        # It trains the full run's first steps: the full section's settings (optimizer, schedule) too.
        return self.training_key("smoke", schedule=self.params.full)

    def record(self, outcome: StageOutcome, tracking: PipelineRecorder) -> StageOutcome:
        tracking.record_stage(outcome)
        announce_smoke(outcome.figures)
        return outcome

    def compute(self, fingerprint: str | None) -> SmokeResult:
        params = self.params
        directory = run_directory(params, "smoke", fingerprint)
        progress = PrefectProgress(f"smoke-iteration-{params.iteration}", params.smoke.max_steps or 1)
        callbacks = [progress, *self.callbacks]
        summary = self.train("smoke", directory, callbacks, resume=False)
        vocab = self.start.model.architecture.vocab_size
        peak = summary.peak_memory_bytes or 0
        gate = judge(progress.losses, progress.val_losses, peak, memory_limit(self.device.device), vocab)
        startup = progress.startup
        full_steps = startup.schedule_steps  # the trainer's count for the full run on this data
        estimate = estimate_run(summary, self.full_plan(full_steps))
        sizing = self.data_sizing(startup, full_steps)
        if (
            warning := sizing.warning()
        ) and params.finetune is None:  # a fine-tune's data is meant to be small
            announce(f"smoke: warning: {warning}")
        optimizer = params.training_section("smoke").optimizer
        result = SmokeResult(
            fingerprint=fingerprint,
            gate=gate,
            optimizer={"source": params.smoke_optimizer_source, **optimizer.model_dump()},
            schedule=FullSchedule(steps=full_steps, warmup_steps=startup.warmup_steps),
            precision=startup.precision,
            val_losses=progress.val_losses,
            summary=summary,
            full_planned_steps=full_steps,
            estimated_full_seconds=estimate.total_seconds if estimate else math.inf,
            estimate=estimate.figures() if estimate else None,
            data_sizing={**sizing.figures(), "warning": sizing.warning()},
            batch=BatchChoice(
                startup.batch_size, startup.grad_accum_steps, startup.batch_size_source, startup.batch_probe
            ),
        )
        written = result.model_dump(exclude={"files", "outputs", "figures"})  # the record as it always was
        record_path = write_json_atomic(directory / SMOKE_RECORD, written, default=str)
        if not gate.passed:
            cause = gate.likely_cause(optimizer.learning_rate, startup.precision)
            reasons = "; ".join(gate.reasons())
            raise TrainingError(f"smoke gate failed: {reasons}; likely cause: {cause}; record: {record_path}")
        figures = {
            **SummaryRecord.headline(summary),
            "first_train_loss": gate.first_train_loss,
            "last_train_loss": gate.last_train_loss,
            "first_val_loss": gate.first_val_loss,
            "last_val_loss": gate.last_val_loss,
            "optimizer_source": params.smoke_optimizer_source,
            "full_planned_steps": full_steps,
            "estimated_full_seconds": round(estimate.total_seconds, 1) if estimate else None,
            **sizing.figures(),
        }
        return result.model_copy(
            update={"files": file_record(record_path), "outputs": [str(record_path)], "figures": figures}
        )

    def full_plan(self, full_steps: int) -> RunPlan:
        """What the full run will do: its steps, evaluations of its validation examples, checkpoints."""
        validation_tokens = int(self.tokens.figures.get("validation_tokens") or 0)
        block_size = self.start.model.architecture.block_size
        validation = examples_in(validation_tokens, block_size, self.params.full.validation_examples)
        return RunPlan.of(self.params.full, full_steps, validation)

    def data_sizing(self, startup: StartupRecord, full_steps: int) -> DataSizing:
        """The full run's tokens (its schedule's steps at its global batch, on its ranks) and the train
        split's, against the model's parameters."""
        global_batch = startup.batch_size * startup.grad_accum_steps * full_world_size(self.params)
        return DataSizing(
            parameter_count=startup.parameter_count,
            train_tokens=int(self.tokens.figures.get("train_tokens") or 0),
            full_tokens=full_steps * global_batch * startup.sequence_length,
        )


def announce_smoke(figures: dict[str, Figure]) -> None:
    def number(name: str) -> float:
        value = figures.get(name)
        return float(value) if isinstance(value, int | float) else math.nan

    announce(
        f"smoke: {number('tokens_per_second'):.0f} tokens/s measured; train loss "
        f"{number('first_train_loss'):.3f} -> {number('last_train_loss'):.3f}, "
        f"validation {number('first_val_loss'):.3f} -> {number('last_val_loss'):.3f}; "
        f"full run of {figures.get('full_planned_steps')} steps estimated at "
        f"{figures.get('estimated_full_seconds')} s"
    )
