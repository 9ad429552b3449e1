"""The estimate of a run's time from a shorter run: the plan counts what a run does, each part priced
by what the shorter run measured of it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gptcore.train.config import TrainingConfig
from gptcore.train.estimate import RunPlan, estimate_run
from gptcore.train.records import SummaryRecord
from gptcore.train.trainer import train
from tests.test_trainer import Recorder, job


def test_the_plan_counts_what_a_run_does(tmp_path: Path) -> None:
    recorder = Recorder()
    training = {"max_steps": 12, "eval_every": 6, "checkpoint_every": 4, "eval_at_start": True}
    run = job(tmp_path, training=training)
    summary = train(run, recorder)
    validation = recorder.of("start")[0]["validation_examples"]
    plan = RunPlan.of(run.training, 12, validation)

    evaluations = recorder.of("eval")
    assert plan.evaluations == len(evaluations) == 3, "the baseline at 0, then 6, then the end"
    assert summary.evaluated_examples == plan.evaluations * plan.validation_examples
    assert summary.evaluation_seconds > 0
    saves = recorder.of("checkpoint")
    assert summary.checkpoint_saves == len(saves)
    assert [s["kind"] for s in saves].count("step") == 2 and plan.checkpoint_saves >= len(saves), (
        "periodic at 4 and 8, a best at most after each evaluation past step 0, the final one"
    )


@pytest.mark.parametrize(
    ("steps", "every", "at_start", "evaluations", "saves", "back_to_back"),
    [
        (12, 6, True, 3, 2 + 1 + 1 + 1, 0),
        (12, 100, False, 1, 2 + 0 + 1 + 1, 0),
        (1, 6, True, 2, 0 + 0 + 1 + 1, 0),
        (21, 5, False, 5, 4 + 4 + 1 + 1, 4),  # evaluations and checkpoints at 5, 10, 15, 20
    ],
)
def test_evaluations_and_saves_follow_the_intervals(
    steps: int, every: int, at_start: bool, evaluations: int, saves: int, back_to_back: int
) -> None:
    training = TrainingConfig(eval_every=every, eval_at_start=at_start, checkpoint_every=5)
    plan = RunPlan.of(training, steps, validation_examples=10)
    assert (plan.evaluations, plan.checkpoint_saves) == (evaluations, saves)
    assert plan.back_to_back_saves == back_to_back
    assert RunPlan.of(training, steps, validation_examples=0).evaluations == 0, "nothing to evaluate"


def test_each_part_is_priced_by_what_the_shorter_run_measured() -> None:
    smoke = SummaryRecord(
        steps_per_second=4.0,
        compile_seconds=30.0,
        evaluation_seconds=2.0,
        evaluated_examples=100,  # 0.02 s an example
        checkpoint_stall_seconds=7.5,
        checkpoint_wait_seconds=6.0,  # the final checkpoint's write, at the end
        checkpoint_saves=3,  # 0.5 s a snapshot
        checkpoint_save_seconds=9.0,  # 3 s a write
    )
    plan = RunPlan(
        steps=1000, evaluations=5, validation_examples=400, checkpoint_saves=8, back_to_back_saves=2
    )
    estimate = estimate_run(smoke, plan)
    assert estimate is not None
    assert (estimate.compile_seconds, estimate.step_seconds) == (30.0, 250.0)
    assert estimate.evaluation_seconds == pytest.approx(5 * 400 * 0.02)
    assert estimate.checkpoint_seconds == pytest.approx(8 * 0.5 + 2 * 3.0 + 6.0), (
        "a snapshot a save, a write a back-to-back save, the end's waits as the shorter run's"
    )
    assert estimate.total_seconds == pytest.approx(30 + 250 + 40 + 16)
    assert estimate.figures()["total_seconds"] == 336.0

    eager = replace(smoke, compile_seconds=None, evaluated_examples=0, checkpoint_saves=0)
    eager = replace(eager, checkpoint_wait_seconds=0.0, checkpoint_save_seconds=0.0)
    assert estimate_run(eager, plan).total_seconds == 250.0, "nothing measured of it: not priced"
    assert estimate_run(SummaryRecord(steps_per_second=0.0), plan) is None, "no step rate: no estimate"
