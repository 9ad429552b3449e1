"""The trainer's records, as dataclasses whose field names ARE the run-record names.

A training run reports four records: `StartupRecord` once, `StepRecord` per log interval, `EvalRecord`
per evaluation and `SummaryRecord` at the end. Each field says what it is to a run record: a `param`
(a run's constant: device, precision, batch size), a `metric` (a figure to plot) or neither (context
for the JSON line). Every consumer (MLflow tracking, the comparison, the pipeline's stages and gate)
asks the record class for its names, so a figure has one name everywhere and no list repeats them.

Records travel as themselves: the trainer hands its callbacks the records, `train` returns the summary,
the pipeline's stage results hold it. They become flat JSON-ready dicts (`to_dict`) only where they leave
the process (JSON lines, a launched rank's channel, MLflow) and are read back with `from_dict`. The class
methods (`params`, `metrics`, `headline`) take a record or such a dict (an MLflow run's, an old result's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Self

from gptcore.tools.records import JSONObject

PARAM = "param"
METRIC = "metric"


def param(**options: Any) -> Any:
    """A field that is one of the run's params."""
    return field(default=options.pop("default", None), metadata={"role": PARAM, **options})


def metric(**options: Any) -> Any:
    """A field that is one of the run's metrics (logged when it is a finite number)."""
    return field(default=options.pop("default", None), metadata={"role": METRIC, **options})


def context(default: Any = None, **options: Any) -> Any:
    """A field of the JSON line that is neither a param nor a metric."""
    return field(default=default, metadata=options)


@dataclass(kw_only=True)
class Record:
    """A record of the trainer; `event` names it in a JSON line."""

    event: ClassVar[str]

    def to_dict(self) -> JSONObject:
        """The record as its JSON line carries it (fields marked `optional` left out while None)."""
        values = asdict(self)
        optional = {f.name for f in fields(self) if f.metadata.get("optional")}
        return {"event": self.event, **{k: v for k, v in values.items() if not (k in optional and v is None)}}

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> Self:
        """The record a dict of `to_dict` holds (a JSON line's); keys it does not know are left out."""
        return cls(**{f.name: payload[f.name] for f in fields(cls) if f.name in payload})

    @classmethod
    def names(cls, role: str) -> tuple[str, ...]:
        """The names of this record's fields with `role` (PARAM or METRIC)."""
        return tuple(f.name for f in fields(cls) if f.metadata.get("role") == role)

    @classmethod
    def metrics(cls, payload: Record | Mapping[str, Any]) -> dict[str, float]:
        """This record's metrics in `payload` that are real numbers."""
        return finite_metrics(as_dict(payload), cls.names(METRIC))

    @classmethod
    def params(cls, payload: Record | Mapping[str, Any]) -> dict[str, Any]:
        """This record's params present in `payload`."""
        values = as_dict(payload)
        return {k: values.get(k) for k in cls.names(PARAM) if k in values}


@dataclass(kw_only=True)
class StartupRecord(Record):
    """What a run trains with, before its first step: the machine, the runtime, the plan, the estimates."""

    event: ClassVar[str] = "startup"
    processor: str = param()
    gpu_name: str | None = param()
    gpu_memory_bytes: int | None = param()
    torch_version: str = param()
    cuda_available: bool = param()
    # The resolved runtime (gptcore.runtime.device.Runtime, every field).
    device: str = param()
    precision: str = param()
    batch_size: int = param()  # per rank and micro-step
    grad_accum_steps: int = param()
    batch_size_source: str = param()  # configured, probed (CUDA) or estimated (batch_size: auto)
    effective_batch_target: int | None = context()  # runtime.effective_batch_size, when asked for
    # How `auto` decided: sizes tried, budget (gptcore.runtime.batch_size.ProbeFigures; not imported: the
    # records load without torch).
    batch_probe: dict[str, int | float | list[Any] | None] = field(default_factory=dict)
    workers: int = param()
    fused_adamw: bool = param()
    tf32_enabled: bool = param()
    tensor_cores_enabled: bool = param()
    pin_memory: bool = context()
    compile: bool = param()
    compile_source: str = context()  # requested, or why auto chose it (or fell back to eager)
    compile_seconds: float | None = context()  # the start-up probe: compiling the step's graphs
    attention_backend: str = param()  # the kernel scaled_dot_product_attention runs: flash, efficient, ...
    activation_checkpointing: bool = param()
    cpu_threads: int = context()
    precision_source: str = context()
    precision_warning: str | None = context()  # an explicit precision that trains slower than fp32 here
    host_allocator: str = context()
    # The plan.
    sequence_length: int = param()
    parameter_count: int = param()
    non_embedding_parameter_count: int = param()  # without token embedding and position table (Kaplan)
    trainable_parameter_count: int = param()  # what the optimizer trains: all but a fine-tune's frozen base
    matmul_parameter_count: int = context()
    max_steps: int | None = param()
    max_flops: float | None = param()  # the compute budget, when the run was given one
    tokens_per_parameter: float | None = param()  # the budget in tokens per parameter, when given
    epochs: float | None = param()
    planned_steps: int = param()
    schedule_steps: int = context()  # the learning-rate schedule's length: the full run's, for a smoke run
    warmup_steps: int = context()
    tokens_per_step: int = context()
    planned_tokens: int | None = param()
    planned_flops: float | None = param()  # planned_tokens x flops_per_token
    train_examples: int | None = param()
    validation_examples: int | None = param()
    steps_per_epoch: int | None = context()
    eval_every: int = context()  # with the two below, what gptcore.train.estimate.RunPlan counts
    eval_at_start: bool = context()
    checkpoint_every: int = context()
    # The estimates.
    estimated_peak_memory_bytes: int = context()
    estimated_memory: dict[str, int] = field(default_factory=dict)
    flops_per_token: float = param()
    flop_formula: str = context()
    peak_flops: float = param()
    peak_flops_source: str = param()
    # Where it runs from.
    checkpoint_directory: str | None = context()
    world_size: int = context(1)
    per_rank_batch_size: int = context()
    global_batch: int = context()
    start_step: int = context(0)
    resumed_from: str | None = context()
    fingerprint: str = param()
    dry_run: bool = context(False)

    @classmethod
    def params(cls, payload: Record | Mapping[str, Any]) -> dict[str, Any]:
        """The startup params, with the effective batch the optimizer sees."""
        values = super().params(payload)
        batch, accumulation = values.get("batch_size"), values.get("grad_accum_steps")
        if batch is not None and accumulation is not None:
            values["effective_batch_size"] = int(batch) * int(accumulation)
        return values

    @property
    def trained_share(self) -> float | None:
        """What the optimizer trains (all but a fine-tune's frozen base), as a share of the parameters."""
        if not self.trainable_parameter_count or not self.parameter_count:
            return None
        return self.trainable_parameter_count / self.parameter_count


@dataclass(kw_only=True)
class StepRecord(Record):
    """One log interval: its mean training loss and how fast it went."""

    event: ClassVar[str] = "step"
    step: int = context(0)
    train_loss: float = metric()
    learning_rate: float = metric()
    grad_norm: float = metric()
    tokens_per_second: float = metric()
    steps_per_second: float = metric()
    mfu: float | None = metric()
    load_average: float | None = metric(optional=True)  # the machine's, over the interval (runtime.load)
    other_cpu_cores: float | None = metric(optional=True)  # what other processes used meanwhile
    epoch: int = context(0)


@dataclass(kw_only=True)
class EvalRecord(Record):
    """One evaluation on the validation tokens (the unigram baseline on the first only)."""

    event: ClassVar[str] = "eval"
    step: int = context(0)
    val_loss: float = metric()
    val_perplexity: float = metric()
    val_bits_per_byte: float | None = metric(optional=True)  # where the token file knows its text bytes
    unigram_val_loss: float | None = metric(optional=True)


@dataclass(kw_only=True)
class SummaryRecord(Record):
    """The end of a run: its figures, its checkpoints. `headline` fields are a stage's figures."""

    event: ClassVar[str] = "summary"
    steps: int = context(0, headline=True)
    planned_steps: int | None = context(headline=True)
    tokens_per_second: float = context(headline=True)  # a metric of every step already
    steps_per_second: float = context(headline=True)
    mfu: float | None = context(headline=True)
    load_average: float | None = metric(headline=True, optional=True)  # over the training (runtime.load)
    other_cpu_cores: float | None = metric(headline=True, optional=True)
    peak_flops: float = context()
    tokens_seen: int = metric(headline=True)  # every step's inputs from step 0 (a resume's earlier ones too)
    training_flops: float = metric(headline=True)  # tokens_seen x flops_per_token
    peak_memory_bytes: int = metric(headline=True)  # the process's peak (CPU: imports, earlier stages)
    training_peak_memory_bytes: int | None = metric(
        headline=True
    )  # the training's own (gptcore.runtime.memory)
    training_peak_memory_source: str = context()  # how it was measured, or why it could not be
    estimated_peak_memory_bytes: int = metric(headline=True)
    final_train_loss: float | None = metric(headline=True)
    final_val_loss: float | None = metric(headline=True)
    best_val_loss: float | None = metric()
    unigram_val_loss: float | None = context(headline=True)
    elapsed_seconds: float = metric(headline=True)
    # The planned steps at the steady rate: this run's steps alone (no start-up, evaluations or
    # checkpoints); the smoke stage's estimate of the full run is `estimated_full_seconds`.
    steady_steps_seconds: float | None = metric(headline=True)
    compile_seconds: float | None = metric(optional=True)  # compiling at start-up, outside every rate
    recompilations: int | None = metric(optional=True)  # graphs compiled again during training
    checkpoint_save_seconds: float = metric()  # writing the files (in the background unless turned off)
    checkpoint_stall_seconds: float = metric()  # what the training loop waited for them
    checkpoint_wait_seconds: float = metric()  # of the stall, waiting for writes (the rest: snapshots)
    checkpoint_saves: int = metric()  # checkpoints taken: a longer run's snapshots are priced by them
    evaluation_seconds: float = metric()  # in evaluations, outside every rate (gptcore.train.estimate)
    evaluated_examples: int = metric()  # validation examples scored, over every evaluation
    optimizer_state_bytes: int = metric(headline=True)  # the optimizer's moments: of what trains alone
    final_checkpoint: str | None = context()
    best_checkpoint: str | None = context()
    latest_checkpoint: str | None = context()
    start_step: int = context(0, headline=True)  # where a resumed run started
    dry_run: bool = context(False)

    @classmethod
    def headline(cls, payload: Record | Mapping[str, Any]) -> dict[str, Any]:
        """The figures a stage reports from a run's summary."""
        values = as_dict(payload)
        return {
            f.name: values[f.name] for f in fields(cls) if f.metadata.get("headline") and f.name in values
        }


# The names as tuples, for readers that want the list itself.
STARTUP_PARAMS = StartupRecord.names(PARAM)
STEP_METRICS = StepRecord.names(METRIC)
EVAL_METRICS = EvalRecord.names(METRIC)
END_METRICS = SummaryRecord.names(METRIC)


def as_dict(payload: Record | Mapping[str, Any]) -> dict[str, Any]:
    """A record's values by name (a dict read back from a JSON line or an MLflow run as it is)."""
    return payload.to_dict() if isinstance(payload, Record) else dict(payload)


def finite_metrics(values: Mapping[str, object], names: tuple[str, ...]) -> dict[str, float]:
    """The named entries that are real numbers (None, NaN and infinities are left out)."""
    chosen = {}
    for name in names:
        value = values.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            chosen[name] = float(value)
    return chosen


def table_columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Rows (dicts with the same keys) column by column, as `MlflowClient.log_table` takes a table."""
    return {key: [row.get(key) for row in rows] for key in (rows or [{}])[0]}
