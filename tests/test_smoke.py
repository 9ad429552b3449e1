"""The smoke run is the full run's first steps; its gate reads validation loss, not only training loss."""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

import pytest
from test_trainer import TRAIN, VALIDATION, Recorder

from gptcore.data.build import build_token_files
from gptcore.data.config import CorpusConfig
from gptcore.data.corpus import open_corpus
from gptcore.data.tokenizer import train_tokenizer
from gptcore.errors import TrainingError
from gptcore.train.config import OptimizerConfig
from gptcore.train.job import TrainJob
from gptcore.train.schedule import WarmupCosine
from gptcore.train.trainer import train
from tasks.params.jobs import train_job
from tasks.params.loading import load_params
from tasks.params.schema import PipelineParams
from tasks.stages.smoke_gate import judge

REPO = Path(__file__).resolve().parent.parent
STDLIB = Path(sysconfig.get_paths()["stdlib"])


def tiny_params(full_optimizer: dict[str, Any], smoke: dict[str, Any] | None = None) -> PipelineParams:
    architecture = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 300}
    return PipelineParams.model_validate(
        {
            "iteration": 1,
            "model": {
                "name": "tiny",
                "architecture": architecture,
                "cpu": {"batch_size": 8},
                "gpu": {"batch_size": 8},
            },
            "tokenizer": {"vocab_size": 300},
            "runtime": {"device": "cpu", "precision": "fp32"},
            "smoke": {"max_steps": 12, "log_every": 6, "eval_every": 12, **(smoke or {})},
            "full": {"max_steps": 400, "optimizer": full_optimizer},
        }
    )


def smoke_run(
    params: PipelineParams,
    train_tokens: Any = TRAIN,
    validation_tokens: Any = VALIDATION,
    checkpoint_directory: Path | None = None,
) -> Recorder:
    recorder = Recorder()
    job = train_job(
        params,
        "smoke",
        train_tokens=train_tokens,
        validation_tokens=validation_tokens,
        checkpoint_directory=checkpoint_directory,
    )
    train(job, recorder)
    return recorder


def gate_of(recorder: Recorder, vocab_size: int) -> Any:
    train_losses = [m["train_loss"] for m in recorder.of("step")]
    val_losses = [m["val_loss"] for m in recorder.of("eval")]
    return judge(train_losses, val_losses, peak_memory=0, memory_limit=1, vocab_size=vocab_size)


def test_the_smoke_trains_with_the_full_sections_optimizer_unless_it_names_its_own() -> None:
    full = {"learning_rate": 6e-4, "min_learning_rate": 6e-5, "warmup_steps": 100, "beta2": 0.99}
    params = tiny_params(full)
    assert params.smoke_optimizer_source == "full"
    assert train_job(params, "smoke", train_tokens=None).training.optimizer == params.full.optimizer
    own = tiny_params(full, {"optimizer": {"learning_rate": 1e-3, "warmup_steps": 2}})
    assert own.smoke_optimizer_source == "smoke"
    assert train_job(own, "smoke", train_tokens=None).training.optimizer == OptimizerConfig(
        learning_rate=1e-3, warmup_steps=2
    )
    assert train_job(own, "full", train_tokens=None).training.optimizer == own.full.optimizer


def test_the_smoke_follows_the_full_runs_schedule_warmup_included(tmp_path: Path) -> None:
    params = tiny_params({"learning_rate": 6e-4, "min_learning_rate": 6e-5, "warmup_steps": 100})
    recorder = smoke_run(params, checkpoint_directory=tmp_path)
    startup = recorder.of("start")[0]
    # 400 examples of batch 8: the full run's 50 steps (one epoch), not the smoke's 12.
    assert (startup["planned_steps"], startup["schedule_steps"], startup["warmup_steps"]) == (12, 50, 49)
    expected = WarmupCosine(6e-4, 6e-5, 49, 50)
    assert [m["learning_rate"] for m in recorder.of("step")] == [expected.rate(5), expected.rate(11)]
    evaluations = [m["step"] for m in recorder.of("eval")]
    assert evaluations == [0, 12], "evaluated before the first step and at the end"
    assert [c["kind"] for c in recorder.of("checkpoint")] == ["best", "final"], "no best at step 0"


def test_an_absurd_learning_rate_fails_the_gate_on_validation_while_train_loss_still_falls() -> None:
    params = tiny_params({"learning_rate": 0.2, "warmup_steps": 1})
    gate = gate_of(smoke_run(params), vocab_size=300)
    assert gate.falling, "train loss, measured before each update, still reads falling"
    assert gate.finite and not gate.val_not_rising and not gate.below_uniform and not gate.passed
    assert gate.last_val_loss > gate.first_val_loss + 0.2
    assert "learning rate (peak 0.2) is likely too high" in gate.likely_cause(0.2, "fp32")


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_full_training_stops_when_validation_goes_above_the_uniform_guess_after_warmup(
    tmp_path: Path, compiled: bool
) -> None:
    params = tiny_params({"learning_rate": 0.5, "warmup_steps": 2})
    settings = params.full.model_copy(update={"max_steps": 12, "eval_every": 6, "checkpoint_every": 3})
    runtime = params.runtime.model_copy(update={"compile": compiled})
    job = train_job(params, "full", train_tokens=TRAIN, validation_tokens=VALIDATION)
    job = TrainJob(
        **{**job.__dict__, "training": settings, "runtime": runtime, "checkpoint_directory": tmp_path}
    )
    recorder = Recorder()
    with pytest.raises(
        TrainingError, match=r"above the uniform guess ln\(300\) = 5.7038 .*: training diverged"
    ):
        train(job, recorder)
    assert recorder.of("start")[0]["compile"] is compiled
    stopped_at = recorder.of("eval")[-1]["step"]
    kept = [c for c in recorder.of("checkpoint") if c["kind"] == "step"]
    assert kept and kept[-1]["step"] < stopped_at, "no checkpoint written of the diverged weights"
    assert (tmp_path / f"step-{kept[-1]['step']:08d}.pt").is_file()
    assert not (tmp_path / "final.pt").exists()


def test_iteration_1s_default_smoke_passes_on_real_text(tmp_path: Path) -> None:
    params = load_params(REPO / "params" / "iteration_1.yaml")
    paths = [str(STDLIB / name / "*.py") for name in ("email", "json", "unittest", "asyncio")]
    corpus = open_corpus(
        CorpusConfig(source="local", paths=paths, validation_fraction=0.2, test_fraction=0.2)
    )
    tokenizer = train_tokenizer(corpus, params.tokenizer, tmp_path)
    tokens = build_token_files(corpus, tokenizer, tmp_path)
    recorder = smoke_run(params, Path(tokens.train.path), Path(tokens.validation.path))
    gate = gate_of(recorder, params.model.architecture.vocab_size)
    assert gate.passed, gate.reasons()
    assert gate.last_val_loss < gate.first_val_loss


def test_with_two_processes_the_full_run_the_smoke_estimates_has_half_the_steps() -> None:
    one = smoke_run(tiny_params({"warmup_steps": 2})).of("start")[0]
    params = tiny_params({"warmup_steps": 2})
    # full training on 2 ranks: a global batch of 16, 25 steps an epoch
    params = params.model_copy(update={"runtime": params.runtime.model_copy(update={"nproc": 2})})
    two = smoke_run(params).of("start")[0]
    assert (one["schedule_steps"], two["schedule_steps"]) == (50, 25)
    assert one["planned_steps"] == two["planned_steps"] == 12, "the smoke itself runs in one process"
