"""A comparison's two bounded runs from a parameter file: the plan (what both sides share), each side's
training, the fp32 side's model in each precision, and both compared in memory (`gptpipe compare
--no-track`). The comparison itself (axes, controls, table) is gptcore's: `gptcore.eval.comparison`."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from gptcore.eval.comparison import (
    ComparisonPlan,
    Limits,
    RunRecord,
    Side,
    choose_axis,
    compare_records,
    inference_side,
)
from gptcore.train.callbacks import TrainingCallback
from tasks.params.schema import PipelineParams


def _identity(path: Path | None) -> str:
    from gptcore.tools.fingerprint import sha256_file

    return f"{Path(path).name}:sha256:{sha256_file(path)[:16]}" if path else "none"


def plan_comparison(
    params: PipelineParams,
    axis: str,
    values: list[str] | None,
    limits: Limits,
    cuda_available: bool,
    batch_size: int | None = None,
    precision: str | None = None,
    train_tokens: Path | None = None,
    validation_tokens: Path | None = None,
    tokenizer: Path | None = None,
) -> ComparisonPlan:
    """The two sides and what they share; a seeded synthetic stream when no token files are given."""
    architecture = params.model_profile().architecture  # a start model's is not resolved here
    batch = batch_size or params.defaults_for("cpu").batch_size
    axis, chosen = choose_axis(axis, values, cuda_available, batch)
    base = {
        "device": "cpu" if axis != "device" else None,
        "precision": precision or "fp32",
        "batch_size": batch,
        "grad_accum_steps": params.runtime.grad_accum_steps or 1,
    }
    if train_tokens is not None:
        train, validation = train_tokens, validation_tokens
        identities = (_identity(train_tokens), _identity(validation_tokens))
    else:
        from gptcore.data.synthetic import synthetic_stream

        window, vocab = architecture.block_size + 1, params.tokenizer.vocab_size
        train = synthetic_stream(vocab, window * limits.training_examples, seed=1)
        validation = synthetic_stream(vocab, window * limits.validation_examples, seed=2, split="validation")
        identities = (f"synthetic:{vocab}:seed1", f"synthetic:{vocab}:seed2")
    data_params = {
        "data.train_tokens": identities[0],
        "data.validation_tokens": identities[1],
        "data.tokenizer": _identity(tokenizer),
    }
    return ComparisonPlan(axis, chosen, base, limits, train, validation, data_params)


def train_side(
    params: PipelineParams,
    plan: ComparisonPlan,
    side: Side,
    callback: TrainingCallback,
    checkpoint_directory: Path | None = None,
) -> None:
    """One bounded run of the smoke section, with the side's runtime; `callback` records it; with a
    `checkpoint_directory`, the trained model is kept there as `final.pt`."""
    from gptcore.runtime.config import RuntimeConfig
    from gptcore.train.config import TrainingConfig
    from gptcore.train.job import TrainJob
    from gptcore.train.trainer import train

    limits = plan.limits
    runtime = RuntimeConfig(**{**params.runtime.model_dump(exclude={"cpu", "gpu"}), **side.runtime})
    training = TrainingConfig.of(params.training_section("smoke")).model_copy(
        update={
            "eval_at_start": False,
            "max_steps": limits.max_steps,
            "epochs": limits.epochs,
            "training_examples": limits.training_examples,
            "validation_examples": limits.validation_examples,
            "log_every": max(1, limits.max_steps // 5),
            "eval_every": limits.max_steps,
            "checkpoint_every": limits.max_steps + 1,
        }
    )
    job = TrainJob(
        model=params.model.architecture,
        runtime=runtime,
        training=training,
        train_tokens=plan.train,
        validation_tokens=plan.validation,
        device_defaults=params.defaults_for,
        metadata=getattr(callback, "metadata", {}),
        checkpoint_directory=checkpoint_directory,
    )
    train(job, callback)


def inference_rows(
    params: PipelineParams, plan: ComparisonPlan, checkpoint: Path, tokenizer: Path | None, folder: Path
) -> dict[str, Any]:
    """fp32, bf16 and int8 inference of the fp32 side's trained model on the comparison's own validation
    windows (`gptcore.eval.quant_tradeoff`): {"rows": [...], "table": markdown}."""
    from gptcore.checkpoint.load import load_model
    from gptcore.data.tokenfile import TokenStream, open_tokens
    from gptcore.eval.config import QuantizeConfig
    from gptcore.eval.quant_tradeoff import measure_tradeoff, tradeoff_markdown
    from gptcore.model.quantization import METHODS, cpu_features

    model, _ = load_model(checkpoint)
    windows = plan.validation if isinstance(plan.validation, TokenStream) else open_tokens(plan.validation)
    block = model.config.block_size
    settings = QuantizeConfig(
        methods=list(METHODS),
        max_test_tokens=plan.limits.validation_examples * block,
        new_tokens=32,
        repeats=3,
    )  # the windows the comparison validated on; a short, bounded timing
    rows = measure_tradeoff(model, settings.methods, windows, tokenizer, settings, params.evaluate, folder)
    return {"rows": [row.to_dict() for row in rows], "table": tradeoff_markdown(rows, cpu_features())}


def compare_in_memory(
    params: PipelineParams, plan: ComparisonPlan, tokenizer: Path | None = None
) -> dict[str, Any]:
    """Both sides trained and compared, with nothing recorded outside this process (a precision
    comparison adds the fp32 side's model in each precision: `inference_rows`)."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="gptpipe-compare-") as scratch:
        kept = inference_side(plan)
        for side in plan.sides():
            record = RunRecord({**params.model.as_params(), **plan.data_params})
            train_side(params, plan, side, record, Path(scratch) / "model" if side == kept else None)
            runs.append(record.record())
        result = compare_records(runs, plan.axis)
        if kept is not None:
            model = Path(scratch) / "model" / "final.pt"
            result["inference"] = inference_rows(params, plan, model, tokenizer, Path(scratch) / "rows")
    return result
