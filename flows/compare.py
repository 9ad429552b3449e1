"""The `compare` flow: the bounded comparison of `gptcore.eval.comparison`, recorded in MLflow.

Both runs are children of one parent run; their controls are read back from MLflow (not from memory)
and compared, so what is compared is what was recorded. The comparison table is printed and logged on
the parent run as artifacts (`comparison.md`, `comparison.json`).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from prefect import flow

from gptcore.errors import ConfigError, first_line
from gptcore.eval.comparison import Limits, compare_records, inference_side, print_comparison
from gptcore.tools.records import JSONObject
from tasks.comparison import inference_rows, plan_comparison, train_side
from tasks.params.schema import PipelineParams
from tasks.tracking import ParentRun, TrackingSession
from tasks.tracking.run_search import recorded_run


def compare_runs(
    session: TrackingSession,
    run_ids: list[str],
    axis: str,
    parent: ParentRun | None = None,
    inference: JSONObject | None = None,
) -> JSONObject:
    """Read two runs back from MLflow, refuse them when their controls differ, return the table (with a
    precision comparison's `inference` rows below it), logged on the `parent` run when given."""
    runs = []
    for run_id in run_ids:
        run = recorded_run(session, run_id)
        if run is None:
            raise ConfigError(f"--runs {run_id}: no such run in {session.target.uri}")
        runs.append(asdict(run))
    result = compare_records(runs, axis)
    if inference is not None:
        result["inference"] = inference
    if parent is not None:
        markdown = f"# Comparison on {axis}\n\n{result['table']}\n"
        if inference is not None:
            markdown += f"\n## The fp32 side's model in each precision\n\n{inference['table']}\n"
            parent.log_table(inference["rows"], "inference.json")
        parent.log_text(markdown, "comparison.md")
        parent.log_dict(result, "comparison.json")
    return result


def run_comparison(
    params: PipelineParams,
    axis: str = "auto",
    values: list[str] | None = None,
    limits: Limits = Limits(),
    batch_size: int | None = None,
    precision: str | None = None,
    train_tokens: Path | None = None,
    validation_tokens: Path | None = None,
    tokenizer: Path | None = None,
) -> JSONObject:
    """Train both sides with identical controls, record them in MLflow, compare them from the record."""
    import torch

    session = TrackingSession.open(params.tracking)  # unreachable store: stop before training
    plan = plan_comparison(
        params, axis, values, limits, torch.cuda.is_available(), batch_size, precision,
        train_tokens, validation_tokens, tokenizer,
    )  # fmt: skip
    parent = ParentRun.start(
        session,
        f"compare-{plan.axis}-{'-vs-'.join(plan.values)}",
        {"kind": "comparison", "compare.axis": plan.axis, "compare.values": ",".join(plan.values)},
    )
    scratch = Path(tempfile.mkdtemp(prefix="gptpipe-compare-"))
    try:
        run_ids = []
        kept = inference_side(plan)  # a precision comparison keeps its fp32 model for the inference rows
        for side in plan.sides():
            callback = parent.child_callback(
                side.name,
                tags={"kind": "comparison", "compare.axis": plan.axis},
                params={**params.model.as_params(), **plan.data_params},
            )
            train_side(params, plan, side, callback, scratch / "model" if side == kept else None)
            run_ids.append(callback.run_id)
        inference = (
            inference_rows(params, plan, scratch / "model" / "final.pt", tokenizer, scratch / "rows")
            if kept is not None
            else None
        )
        result = compare_runs(session, run_ids, plan.axis, parent=parent, inference=inference)
    except BaseException as error:
        parent.fail(first_line(error))
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    parent.finish()
    result["parent_run_id"] = parent.run_id
    result["url"] = parent.url
    return result


@flow(name="compare", log_prints=False, persist_result=False)
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
) -> JSONObject:
    """Two bounded training runs differing in one axis, recorded in MLflow and compared."""
    from tasks.params.loading import load_params

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
    print_comparison(result)
    return {k: v for k, v in result.items() if k != "runs"} | {
        "run_ids": [r["run_id"] for r in result["runs"]]
    }
