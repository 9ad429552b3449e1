"""The run records: their field names are the names a run's lines, MLflow and the stages use."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from gptcore.data.synthetic import synthetic_stream
from gptcore.model.config import ModelConfig
from gptcore.runtime.config import RuntimeConfig
from gptcore.train.callbacks import TrainingCallback
from gptcore.train.config import OptimizerConfig, TrainingConfig
from gptcore.train.job import TrainJob
from gptcore.train.records import (
    END_METRICS,
    METRIC,
    PARAM,
    EvalRecord,
    StartupRecord,
    StepRecord,
    SummaryRecord,
)
from gptcore.train.trainer import train


class Lines(TrainingCallback):
    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    def on_start(self, startup: StartupRecord) -> None:
        self.lines.append(startup.to_dict())

    def on_step(self, record: StepRecord) -> None:
        self.lines.append(record.to_dict())

    def on_eval(self, record: EvalRecord) -> None:
        self.lines.append(record.to_dict())

    def on_end(self, summary: SummaryRecord) -> None:
        self.lines.append(summary.to_dict())


def test_the_trainer_reports_exactly_the_fields_of_its_record_classes() -> None:
    lines = Lines()
    train(
        TrainJob(
            model=ModelConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=300),
            runtime=RuntimeConfig(device="cpu", precision="fp32", batch_size=2),
            training=TrainingConfig(
                max_steps=4, log_every=2, eval_every=2, optimizer=OptimizerConfig(warmup_steps=1)
            ),
            train_tokens=synthetic_stream(300, 9 * 64, 1),
            validation_tokens=synthetic_stream(300, 9 * 8, 2),
        ),
        lines,
    )
    classes = {"startup": StartupRecord, "step": StepRecord, "eval": EvalRecord, "summary": SummaryRecord}
    for line in lines.lines:
        record = classes[line["event"]]
        assert set(line) - {"event"} <= set(record.__dataclass_fields__), line["event"]
        optional = {f.name for f in fields(record) if f.metadata.get("optional")}
        assert {*record.names(PARAM), *record.names(METRIC)} - optional <= set(line), line["event"]
    evals = [line for line in lines.lines if line["event"] == "eval"]
    assert len(evals) == 2 and "unigram_val_loss" in evals[0]
    assert "unigram_val_loss" not in evals[1]  # the baseline once, on the first evaluation


def test_a_record_reads_its_params_and_finite_metrics_from_a_line() -> None:
    line = {"step": 3, "train_loss": 2.5, "grad_norm": float("nan"), "mfu": None, "epoch": 0, "extra": 1.0}
    assert StepRecord.metrics(line) == {"train_loss": 2.5}
    startup = {"device": "cpu", "batch_size": 4, "grad_accum_steps": 2, "start_step": 0}
    assert StartupRecord.params(startup) == {
        "device": "cpu",
        "batch_size": 4,
        "grad_accum_steps": 2,
        "effective_batch_size": 8,
    }
    assert "best_val_loss" in END_METRICS and "tokens_per_second" not in END_METRICS  # a step metric
    assert SummaryRecord.headline({"steps": 4, "final_val_loss": 3.0, "final_checkpoint": "x"}) == {
        "steps": 4,
        "final_val_loss": 3.0,
    }
