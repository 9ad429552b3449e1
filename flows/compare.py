"""The `compare` flow: the course's bounded device comparison, two training runs that differ in one thing.

Both runs share the model, token files, tokenizer, example limits, batch size, precision and epochs;
only the compared axis changes: the device (CPU against CUDA) where there is a GPU, else the precision
or the batch size. The runs are recorded in MLflow under one parent run; their controls are read back
from MLflow and compared, and two runs whose controls differ are refused, with the differing controls
listed. The comparison table is printed and logged as an artifact (`comparison.md`, `comparison.json`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow

from gptcore.errors import ConfigError, GptpipeError

AXES = ("device", "precision", "batch_size")
# Params every compared run must share (the axis itself aside), as recorded by MLflowCallback.
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


def _format(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.4g}"


def comparison_table(axis: str, runs: list[dict[str, Any]]) -> str:
    """Markdown: one row per figure, one column per run, and the second run's ratio to the first."""
    header = [f"figure ({axis})", *(f"{r['params'].get(axis)} ({r['run_id'][:8]})" for r in runs), "ratio"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for figure in FIGURES:
        values = [r["metrics"].get(figure) for r in runs]
        ratio = values[1] / values[0] if None not in values and values[0] else None
        lines.append("| " + " | ".join([figure, *map(_format, values), _format(ratio)]) + " |")
    return "\n".join(lines)


def compare_runs(
    session: Any, run_ids: list[str], axis: str, parent_run_id: str | None = None
) -> dict[str, Any]:
    """Read two runs back from MLflow, refuse them when their controls differ, log and return the table."""
    if axis not in AXES:
        raise ConfigError(f"--axis {axis!r}: expected one of {', '.join(AXES)}")
    runs = []
    for run_id in run_ids:
        try:
            run = session.client.get_run(run_id)
        except Exception:
            raise ConfigError(f"--runs {run_id}: no such run in {session.target.uri}") from None
        runs.append({"run_id": run_id, "params": dict(run.data.params), "metrics": dict(run.data.metrics)})
    differences = differing_controls(runs[0]["params"], runs[1]["params"], axis)
    if differences:
        raise NotComparable(
            f"runs {run_ids[0]} and {run_ids[1]} are not comparable on {axis}: their controls differ: "
            + "; ".join(differences)
        )
    table = comparison_table(axis, runs)
    result = {"axis": axis, "runs": runs, "table": table, "comparable": True}
    if parent_run_id:
        session.client.log_text(parent_run_id, f"# Comparison on {axis}\n\n{table}\n", "comparison.md")
        session.client.log_dict(parent_run_id, result, "comparison.json")
    return result


# --- the two bounded runs -----------------------------------------------------------------------------


def _identity(path: Path | None) -> str:
    from gptcore.fingerprint import sha256_file

    return f"{Path(path).name}:sha256:{sha256_file(path)[:16]}" if path else "none"


def _sources(params: Any, limits: Limits, train_tokens: Path | None, validation_tokens: Path | None) -> tuple:
    """The token sources and their identities; a seeded synthetic stream when no files are given."""
    if train_tokens is not None:
        return train_tokens, validation_tokens, _identity(train_tokens), _identity(validation_tokens)
    from gptcore.synthetic import synthetic_stream

    window, vocab = params.model.architecture.block_size + 1, params.tokenizer.vocab_size
    train = synthetic_stream(vocab, window * limits.training_examples, seed=1)
    validation = synthetic_stream(vocab, window * limits.validation_examples, seed=2, split="validation")
    return train, validation, f"synthetic:{vocab}:seed1", f"synthetic:{vocab}:seed2"


def _train_one(params: Any, session: Any, parent: str, side: dict[str, Any], data: dict[str, Any]) -> str:
    from gptcore.config import RuntimeConfig
    from gptcore.trainer import TrainJob, train
    from tasks.tracking import profile_params

    limits: Limits = data["limits"]
    runtime = RuntimeConfig(**{**params.runtime.model_dump(exclude={"cpu", "gpu"}), **side["runtime"]})
    training = params.smoke.model_copy(
        update={
            "max_steps": limits.max_steps,
            "epochs": limits.epochs,
            "training_examples": limits.training_examples,
            "validation_examples": limits.validation_examples,
            "log_every": max(1, limits.max_steps // 5),
            "eval_every": limits.max_steps,
            "checkpoint_every": limits.max_steps + 1,
        }
    )
    callback = session.training_callback(
        side["name"],
        parent_run_id=parent,
        tags={"kind": "comparison", "compare.axis": data["axis"]},
        params={**profile_params(params), **data["params"]},
    )
    job = TrainJob(
        model=params.model.architecture,
        runtime=runtime,
        training=training,
        train_tokens=data["train"],
        validation_tokens=data["validation"],
        device_defaults=params.defaults_for,
        metadata=callback.metadata,
    )
    train(job, callback)
    return callback.run_id


def run_comparison(
    params: Any,
    axis: str = "auto",
    values: list[str] | None = None,
    limits: Limits = Limits(),
    batch_size: int | None = None,
    precision: str | None = None,
    train_tokens: Path | None = None,
    validation_tokens: Path | None = None,
    tokenizer: Path | None = None,
    session: Any = None,
) -> dict[str, Any]:
    """Train both sides with identical controls, record them in MLflow, compare them from the record."""
    import torch

    from tasks.tracking import TrackingSession

    session = session or TrackingSession.open(params.tracking)  # unreachable store: stop before training
    batch = batch_size or params.defaults_for("cpu").batch_size
    axis, chosen = choose_axis(axis, values, torch.cuda.is_available(), batch)
    base = {
        "device": "cpu" if axis != "device" else None,
        "precision": precision or "fp32",
        "batch_size": batch,
        "grad_accum_steps": params.runtime.grad_accum_steps or 1,
    }
    train, validation, train_id, validation_id = _sources(params, limits, train_tokens, validation_tokens)
    data = {
        "limits": limits,
        "axis": axis,
        "train": train,
        "validation": validation,
        "params": {
            "data.train_tokens": train_id,
            "data.validation_tokens": validation_id,
            "data.tokenizer": _identity(tokenizer),
        },
    }
    parent = session.client.create_run(
        session.experiment_id,
        run_name=f"compare-{axis}-{'-vs-'.join(chosen)}",
        tags={"kind": "comparison", "compare.axis": axis, "compare.values": ",".join(chosen)},
    ).info.run_id
    try:
        run_ids = []
        for value in chosen:
            runtime = {**base, axis: int(value) if axis == "batch_size" else value}
            side = {"name": f"compare-{axis}-{value}", "runtime": runtime}
            run_ids.append(_train_one(params, session, parent, side, data))
        result = compare_runs(session, run_ids, axis, parent_run_id=parent)
    except BaseException as error:
        session.client.set_tag(
            parent, "failure_reason", str(error).splitlines()[0] if str(error) else "stopped"
        )
        session.client.set_terminated(parent, "FAILED")
        raise
    session.client.set_terminated(parent, "FINISHED")
    result["parent_run_id"] = parent
    result["url"] = session.run_url(parent)
    return result


@flow(name="compare", log_prints=False)
def compare(
    params_path: str = "params/iteration_1.yaml",
    overrides: list[str] | None = None,
    axis: str = "auto",
    values: list[str] | None = None,
    max_steps: int = 10,
    training_examples: int = 64,
    validation_examples: int = 16,
    batch_size: int | None = None,
    precision: str | None = None,
    train_tokens: str | None = None,
    validation_tokens: str | None = None,
    tokenizer: str | None = None,
) -> dict[str, Any]:
    """Two bounded training runs differing in one axis, recorded in MLflow and compared."""
    from gptcore.config import load_params

    params = load_params(params_path, list(overrides or []))
    limits = Limits(max_steps, training_examples, validation_examples)
    result = run_comparison(
        params,
        axis,
        values,
        limits,
        batch_size,
        precision,
        Path(train_tokens) if train_tokens else None,
        Path(validation_tokens) if validation_tokens else None,
        Path(tokenizer) if tokenizer else None,
    )
    print_result(result)
    return {k: v for k, v in result.items() if k != "runs"} | {
        "run_ids": [r["run_id"] for r in result["runs"]]
    }


def print_result(result: dict[str, Any]) -> None:
    """The table for the person at the terminal, then one JSON line for scripts."""
    print(result["table"])
    summary = {
        "event": "comparison",
        "axis": result["axis"],
        "run_ids": [r["run_id"] for r in result["runs"]],
    }
    if "url" in result:
        summary["url"] = result["url"]
    print(json.dumps(summary))
