"""How long a run will take, from a shorter run's figures on the same device, model and batch.

The smoke stage estimates the full run with it before starting it, and the GPU check judges that
estimate against a measured run. A run's time (`elapsed_seconds`: the trainer's `run`) is its start-up
compilation, its optimizer steps at the steady rate, its evaluations (each covers every validation
example, so their cost goes by examples) and the training loop's stalls for checkpoints (a snapshot
each, and the wait at the end for the last writes); each is priced by what the shorter run measured of
it, and counted for the longer run from its settings.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from gptcore.train.config import TrainingConfig
from gptcore.train.records import SummaryRecord


@dataclass(frozen=True)
class RunPlan:
    """What a run will do, counted before it starts."""

    steps: int  # optimizer steps
    evaluations: int  # the baseline (when at start), the periodic ones, the final one
    validation_examples: int  # each evaluation's examples
    checkpoint_saves: int  # periodic, best (at most one an evaluation after step 0), final
    # Periodic saves at an evaluation's step: the best checkpoint just taken is still being written,
    # and one write is in flight at most, so the loop waits for it.
    back_to_back_saves: int = 0

    @classmethod
    def of(cls, training: TrainingConfig, steps: int, validation_examples: int) -> RunPlan:
        """The plan of a run of `steps` under `training`'s evaluation and checkpoint intervals."""
        evaluations = training.evaluations(steps) if validation_examples > 0 else 0
        past_start = evaluations - int(training.eval_at_start and evaluations > 0)  # each may save best
        both = math.lcm(training.eval_every, training.checkpoint_every)
        return cls(
            steps=steps,
            evaluations=evaluations,
            validation_examples=validation_examples,
            checkpoint_saves=training.periodic_checkpoints(steps) + past_start + 1,  # and final, always
            back_to_back_saves=(steps - 1) // both if evaluations else 0,
        )


@dataclass(frozen=True)
class RunTimeEstimate:
    """A run's seconds by where they go; `total_seconds` is what its `elapsed_seconds` should read."""

    compile_seconds: float
    step_seconds: float
    evaluation_seconds: float
    checkpoint_seconds: float

    @property
    def total_seconds(self) -> float:
        return self.compile_seconds + self.step_seconds + self.evaluation_seconds + self.checkpoint_seconds

    def figures(self) -> dict[str, float]:
        """The parts and the total by name, rounded to a tenth of a second."""
        parts = {name: round(value, 1) for name, value in asdict(self).items()}
        return {**parts, "total_seconds": round(self.total_seconds, 1)}


def estimate_run(measured: SummaryRecord, plan: RunPlan) -> RunTimeEstimate | None:
    """`plan` priced by `measured`, a shorter run's summary; None when it measured no step rate."""
    steps_per_second = float(measured.steps_per_second or 0.0)
    if steps_per_second <= 0:
        return None
    examples = measured.evaluated_examples or 0
    per_example = float(measured.evaluation_seconds or 0.0) / examples if examples else 0.0
    saves = measured.checkpoint_saves or 0
    waits = float(measured.checkpoint_wait_seconds or 0.0)
    snapshots = float(measured.checkpoint_stall_seconds or 0.0) - waits
    per_snapshot = snapshots / saves if saves else 0.0
    per_write = float(measured.checkpoint_save_seconds or 0.0) / saves if saves else 0.0
    return RunTimeEstimate(
        compile_seconds=float(measured.compile_seconds or 0.0),  # compiled again at its start
        step_seconds=plan.steps / steps_per_second,
        evaluation_seconds=plan.evaluations * plan.validation_examples * per_example,
        # A snapshot a save, a whole write a back-to-back save; the shorter run's waits are taken as the
        # end's (the final checkpoint is on disk before a run returns, right after the best one), the
        # same in both runs when writes keep up with the interval.
        checkpoint_seconds=plan.checkpoint_saves * per_snapshot + plan.back_to_back_saves * per_write + waits,
    )
