"""The course's bounded comparison: two training runs that differ in one thing, and nothing else.

Both runs share the model, token sources, tokenizer, example limits, batch size, precision and epochs;
only the compared axis changes: the device (CPU against CUDA) where there is a GPU, else the precision
or the batch size. Each run's record (params and metrics under the run-record names) is read back and
the controls compared: two runs whose controls differ are refused, with the differing controls listed.

This module holds the comparison itself: the axis, the two sides, the controls, the table, and a run
recorded in memory (`RunRecord`). The pipeline plans and trains the sides from a parameter file
(`tasks.comparison`); where the records live is its caller's choice: MLflow (`flows.compare`) or memory
(`gptpipe compare --no-track`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gptcore.errors import ConfigError, GptpipeError
from gptcore.eval.benchmarks import is_headline
from gptcore.tools.markdown import table
from gptcore.train.callbacks import TrainingCallback
from gptcore.train.records import EvalRecord, StartupRecord, StepRecord, SummaryRecord

AXES = ("device", "precision", "batch_size")
# Params every compared run must share (the axis itself aside), as recorded under the run-record names.
CONTROLS = (
    "model.n_layer",
    "model.n_head",
    "model.n_embd",
    "model.block_size",
    "model.vocab_size",
    "model.dropout",
    "model.bias",
    "data.train_tokens",
    "data.validation_tokens",
    "data.tokenizer",
    "train_examples",
    "validation_examples",
    "device",
    "precision",
    "batch_size",
    "grad_accum_steps",
    "epochs",
    "max_steps",
    "sequence_length",
)
FIGURES = (
    "tokens_per_second",
    "steps_per_second",
    "mfu",
    "peak_memory_bytes",
    "final_train_loss",
    "final_val_loss",
    "elapsed_seconds",
)


class NotComparable(GptpipeError):
    """Two runs whose controls differ: their figures say nothing about the compared axis alone."""

    exit_code = 1


@dataclass(frozen=True)
class Limits:
    """The bounded run both sides train (small by default: a comparison, not a training)."""

    max_steps: int = 10
    training_examples: int = 64
    validation_examples: int = 16
    epochs: int = 1


def choose_axis(
    axis: str, values: list[str] | None, cuda_available: bool, batch_size: int
) -> tuple[str, list[str]]:
    """The axis and its two values: `auto` is CPU against CUDA with a GPU, else fp32 against bf16."""
    if axis not in ("auto", *AXES):
        raise ConfigError(f"--axis {axis!r}: expected one of auto, {', '.join(AXES)}")
    if axis == "auto":
        axis = "device" if cuda_available else "precision"
    defaults = {
        "device": ["cpu", "cuda"],
        "precision": ["fp32", "bf16"],
        "batch_size": [str(batch_size), str(batch_size * 2)],
    }
    chosen = list(values) if values else defaults[axis]
    if len(chosen) != 2 or chosen[0] == chosen[1]:
        raise ConfigError(f"--values {','.join(chosen)}: expected two different values of {axis}")
    if axis == "device" and "cuda" in chosen and not cuda_available:
        raise ConfigError(
            "--axis device: CUDA is not available on this machine; use --axis precision or --axis batch_size"
        )
    return axis, chosen


def differing_controls(first: dict[str, str], second: dict[str, str], axis: str) -> list[str]:
    """Controls whose recorded values differ (the compared axis excepted), as `name: a != b`."""
    return [
        f"{name}: {first.get(name)!r} != {second.get(name)!r}"
        for name in CONTROLS
        if name != axis and first.get(name) != second.get(name)
    ]


@dataclass(frozen=True)
class RunFigures:
    """One run as a comparison reads it: as MLflow holds it (params as text, each metric's latest)."""

    run_id: str | None  # MLflow's; None for a run recorded in memory
    params: dict[str, str]  # its parameters
    metrics: dict[str, float]  # each metric's latest value

    @classmethod
    def of(cls, run: RunFigures | Mapping[str, Any]) -> RunFigures:
        """A run's figures, from a record read back as JSON ({run_id, params, metrics}) too."""
        if isinstance(run, RunFigures):
            return run
        return cls(run.get("run_id"), dict(run["params"]), dict(run["metrics"]))

    def column(self, axis: str) -> str:
        """Its column's heading: its value on `axis`, and its run id's start when recorded."""
        value = self.params.get(axis)
        return f"{value} ({self.run_id[:8]})" if self.run_id else str(value)


def comparison_table(axis: str, runs: Sequence[RunFigures]) -> str:
    """Markdown: one row per figure, one column per run, and the second run's ratio to the first."""
    header = [f"figure ({axis})", *(r.column(axis) for r in runs), "ratio"]
    rows = []
    benchmarks = sorted({name for run in runs for name in run.metrics if is_headline(name)})
    for figure in [*FIGURES, *benchmarks]:  # a pipeline run's benchmark scores too (`<task>/<metric>`)
        values = [r.metrics.get(figure) for r in runs]
        ratio = values[1] / values[0] if None not in values and values[0] else None
        rows.append([figure, *values, ratio])
    return table(header, rows)


def compare_records(runs: Sequence[RunFigures | Mapping[str, Any]], axis: str) -> dict[str, Any]:
    """Two runs compared on `axis`, as the JSON a comparison records (`comparison.json`: axis, runs,
    table, comparable; a caller adds its `inference` rows); refused when controls differ."""
    if axis not in AXES:
        raise ConfigError(f"--axis {axis!r}: expected one of {', '.join(AXES)}")
    figures = [RunFigures.of(run) for run in runs]
    differences = differing_controls(figures[0].params, figures[1].params, axis)
    if differences:
        names = [r.run_id or r.params.get(axis) for r in figures]
        raise NotComparable(
            f"runs {names[0]} and {names[1]} are not comparable on {axis}: their controls differ: "
            + "; ".join(differences)
        )
    table_text = comparison_table(axis, figures)
    return {"axis": axis, "runs": [asdict(r) for r in figures], "table": table_text, "comparable": True}


def print_comparison(result: dict[str, Any]) -> None:
    """The table for the person at the terminal, then one JSON line for scripts."""
    print(result["table"])
    if "inference" in result:
        print("\nThe fp32 side's model in each precision, on the same validation windows:\n")
        print(result["inference"]["table"] + "\n")
    summary: dict[str, object] = {
        "event": "comparison",
        "axis": result["axis"],
        "run_ids": [r.get("run_id") for r in result["runs"]],
    }
    if not any(summary["run_ids"]):  # not recorded anywhere: the figures themselves, for scripts
        summary["runs"] = [{"params": r["params"], "metrics": r["metrics"]} for r in result["runs"]]
    if "url" in result:
        summary["url"] = result["url"]
    print(json.dumps(summary))


# --- the two bounded runs -----------------------------------------------------------------------------

# The runtime settings a comparison's side overrides (`gptcore.runtime.config.RuntimeConfig`'s fields).
RuntimeSettings = dict[str, str | int | None]


@dataclass(frozen=True)
class Side:
    """One of the two runs: its name and the runtime settings it trains with."""

    name: str  # its run's: compare-<axis>-<value>
    runtime: RuntimeSettings  # the shared settings, its own value on the axis


@dataclass
class ComparisonPlan:
    """What both sides share (limits, token sources and their identities) and what tells them apart."""

    axis: str  # what tells the sides apart (AXES)
    values: list[str]  # each side's value on it
    base: RuntimeSettings  # the runtime settings both share
    limits: Limits  # the bounded runs' steps and examples
    train: Any  # the train tokens: a token file's path or a TokenStream
    validation: Any  # the validation tokens, the same
    data_params: dict[str, str] = field(default_factory=dict)  # the data's identities, as params

    def sides(self) -> list[Side]:
        return [
            Side(
                f"compare-{self.axis}-{value}",
                {**self.base, self.axis: int(value) if self.axis == "batch_size" else value},
            )
            for value in self.values
        ]


# --- inference rows of a precision comparison ---------------------------------------------------------

INFERENCE_REFERENCE = "fp32"


def inference_side(plan: ComparisonPlan) -> Side | None:
    """The side whose trained model the inference rows quantize: the fp32 one of a precision comparison."""
    if plan.axis != "precision":
        return None
    return next((side for side in plan.sides() if side.runtime["precision"] == INFERENCE_REFERENCE), None)


class RunRecord(TrainingCallback):
    """A run recorded in memory as MLflow would hold it: params as text, each metric's latest value."""

    def __init__(self, extra: dict[str, Any] | None = None) -> None:
        self.extra = dict(extra or {})  # params the trainer does not report: the profile, the data
        self.params: dict[str, str] = {}
        self.metrics: dict[str, float] = {}

    def on_start(self, startup: StartupRecord) -> None:
        self.params = {k: str(v) for k, v in {**StartupRecord.params(startup), **self.extra}.items()}

    def on_step(self, record: StepRecord) -> None:
        self.metrics.update(StepRecord.metrics(record))

    def on_eval(self, record: EvalRecord) -> None:
        self.metrics.update(EvalRecord.metrics(record))

    def on_end(self, summary: SummaryRecord) -> None:
        self.metrics.update(SummaryRecord.metrics(summary))

    def record(self) -> RunFigures:
        return RunFigures(None, self.params, self.metrics)
