"""The `scale` flow: a scaling study through the pipeline's own stages, and the run it plans.

Every depth of the size dial (`scale.depths`) is trained at every FLOPs budget (`scale.budgets`) as a
sweep trial (`flows.sweep`: the data stages once, each point `gptpipe run --until evaluate` in its own
process, cached and resumable, or on a work pool's workers), and measured on the test split. The law
L(N, D) = E + A/N^α + B/D^β is fitted to their test bits per byte (`gptcore.scaling`), on every parameter
and on the non-embedding ones, the one that predicts the largest budget from the smaller ones better kept;
the IsoFLOP minima beside it. The study's MLflow run holds the coefficients, the compute-optimal tokens
per parameter, the table of points and two plots; the target budget (`scale.target_flops`, default 4x the
largest, or `scale.target_seconds` on this device) becomes a parameter file with the predicted best depth
and its prediction, or a one-line refusal where the points cannot claim one.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import flow

from flows.sweep import data_stages, run_trials
from flows.trials import TableRun, TrialResult
from gptcore.errors import ConfigError
from gptcore.scaling.plan import (
    Budget,
    Limits,
    Planned,
    choose,
    enough_points,
)
from gptcore.scaling.points import ScalingPoint
from gptcore.scaling.study import Study, study
from gptcore.tools.markdown import table
from gptcore.tools.records import JSONObject
from tasks.params.scale import (
    candidates,
    dial_size,
    grid_trials,
    shared_overrides,
    study_settings,
    target_budget,
    write_planned,
)
from tasks.params.schema import PipelineParams, ScaleConfig
from tasks.params.sweep import Trial
from tasks.tracking import ParentRun

TABLE_ARTIFACT = "scaling_points.json"
DEEPER = 2  # the planned run may be up to this many depths past the grid's deepest


@flow(name="scale", log_prints=False, persist_result=False)
def scale(params_path: str, overrides: list[str] | None = None, options: dict[str, Any] | None = None,
          parallel: int | None = None, work_pool: str | None = None) -> JSONObject:  # fmt: skip
    """The study of the parameter file's `scale:` section (`options` override its keys): the grid, the
    fit, the plots, the planned run's parameter file."""
    from flows.environment.prefect_settings import hide_user_error_tracebacks
    from tasks.params.loading import load_params
    from tasks.params.sweep import validate_trials

    hide_user_error_tracebacks()
    base = list(overrides or [])
    params = load_params(params_path, base)
    settings = study_settings(params.scale, options or {})
    budget = target_budget(settings)
    grid_base = [*base, *shared_overrides(params, settings)]
    trials = grid_trials(settings)
    validate_trials(Path(params_path), grid_base, trials)  # every point checked before anything runs
    run = ParentRun.open(
        params.tracking, f"scale-{len(settings.depths)}x{len(settings.budgets)}", {"kind": "scale"}
    )
    run.log_params({f"scale.{key}": json.dumps(value) for key, value in settings.model_dump().items()})
    results = [TrialResult(trial) for trial in trials]
    try:
        data = data_stages(params_path, grid_base, run.run_id)
        train_tokens = int(data.figure("tokens", "train_tokens") or 0)
        trials = one_epoch_trials(params, trials, train_tokens)
        results = run_trials(params_path, grid_base, trials, run, parallel, work_pool)
        points = scaling_points(results)
        return conclude(Path(params_path), base, params, settings, budget, points, train_tokens, run)
    finally:
        done = all(result.state == "completed" for result in results)
        rows = [result.row().to_dict() for result in results]
        where = TableRun(run.session, run.run_id, "Scaling grid", "scaling_trials.json", "gptpipe-scale")
        where.publish(rows, trials_table(results), done, "the scaling grid's runs")


def one_epoch_trials(params: PipelineParams, trials: list[Trial], train_tokens: int) -> list[Trial]:
    """The points whose budget fits one pass over the training tokens, counted as the planned run's
    (`epoch_limits`) but in windows, since no run has chosen its batch yet; the others left out, and said."""
    limits = epoch_limits(params, params.model_profile().architecture.block_size, train_tokens, False)
    kept = []
    for trial in trials:
        size, flops = dial_size(params, trial.values["model.depth"]), trial.values["full.max_flops"]
        if train_tokens and not limits.fits(size, flops):
            print(f"scale: {trial.name} left out: {size.tokens_for(flops):,} tokens, more than one epoch of "
                  f"{limits.epoch_tokens:,}", file=sys.stderr, flush=True)  # fmt: skip
            continue
        kept.append(trial)
    return kept


def scaling_points(results: list[TrialResult]) -> list[ScalingPoint]:
    """The finished runs as points (a failed one is in the table, not in the fit)."""
    points = []
    for result in results:
        figures = result.figures
        if result.state != "completed" or "test_bits_per_byte" not in figures:
            continue
        points.append(
            ScalingPoint(
                depth=int(result.trial.values["model.depth"]),
                max_flops=float(result.trial.values["full.max_flops"]),
                parameter_count=int(figures["parameter_count"]),
                non_embedding_parameter_count=int(figures["non_embedding_parameter_count"]),
                tokens_seen=int(figures["tokens_seen"]),
                training_flops=float(figures["training_flops"]),
                test_bits_per_byte=float(figures["test_bits_per_byte"]),
                tokens_per_step=int(figures["tokens_per_step"]),
                tokens_per_second=figures.get("tokens_per_second"),
            )
        )
    return points


def conclude(
    source: Path,
    base: list[str],
    params: PipelineParams,
    settings: ScaleConfig,
    budget: Budget,
    points: list[ScalingPoint],
    train_tokens: int,
    run: ParentRun,
) -> JSONObject:
    """The fit, its plots and table on the study's run, and the planned run's parameter file (or the
    refusal, as the run's `scale.refusal` tag and a ConfigError)."""
    enough_points(points)
    kinds = ("total", "non_embedding") if settings.parameters == "auto" else (settings.parameters,)
    found = study(points, kinds, settings.bootstrap)
    deepest = max(settings.depths) + DEEPER
    planned: Planned | None = None
    try:
        limits = epoch_limits(params, tokens_per_step(points), train_tokens, settings.within_one_epoch)
        planned = choose(found, points, budget, candidates(params, points, deepest), limits)
    except ConfigError as refusal:
        run.set_tag("scale.refusal", str(refusal))
        record(run, found, None, points)
        raise
    record(run, found, planned, points)
    target = (
        Path(settings.write)
        if settings.write
        else source.with_name(f"iteration_{params.iteration}_planned.yaml")
    )
    written = write_planned(source, base, planned, run.run_id, target)
    run.log_file(written, "planned")
    return {"scale_run_id": run.run_id, "planned": asdict(planned), "parameter_file": str(written),
            "law": found.chosen.law.as_dict(), "parameters": found.chosen.kind.name}  # fmt: skip


def tokens_per_step(points: list[ScalingPoint]) -> int:
    """The grid's tokens per optimizer step (every point trains the same batch; the planned run too)."""
    steps = {point.tokens_per_step for point in points}
    if len(steps) != 1:
        raise ConfigError(
            f"scale: the grid's runs trained {sorted(steps)} tokens a step; the law needs one batch"
        )
    return steps.pop()


def epoch_limits(params: PipelineParams, per_step: int, train_tokens: int, within_one_epoch: bool) -> Limits:
    """One epoch as the trainer counts it: the training windows of block_size + 1 tokens, in whole steps."""
    block = params.model_profile().architecture.block_size
    windows_per_step = per_step // block
    epoch_steps = (train_tokens // (block + 1)) // windows_per_step
    return Limits(epoch_steps * per_step, per_step, within_one_epoch)


def record(run: ParentRun, found: Study, planned: Planned | None, points: list[ScalingPoint]) -> None:
    """The study on its run: the law's coefficients and errors as metrics, the points' table, the plots."""
    from gptcore.scaling import plots

    law, chosen = found.chosen.law, found.chosen
    metrics = {f"law.{key}": value for key, value in law.as_dict().items()}
    metrics |= {f"holdout_error.{name}": fit.holdout_error for name, fit in found.fits.items()}
    if planned is not None:
        metrics |= {key: float(value) for key, value in asdict(planned).items()}
        metrics["optimal_tokens_per_parameter"] = law.optimal_tokens_per_parameter(planned.max_flops)
    if found.exponent is not None:
        metrics["isoflop.size_exponent"] = found.exponent[1]
    run.log_metrics(metrics)
    run.log_params({"scale.law_parameters": chosen.kind.name, "scale.holdout": chosen.holdout})
    rows = [
        asdict(p) | {"fitted": chosen.predict(p), "residual": r}
        for p, r in zip(points, chosen.residuals, strict=True)
    ]
    run.log_table(rows, TABLE_ARTIFACT)
    with tempfile.TemporaryDirectory(prefix="gptpipe-scale-") as folder:
        for path in (
            plots.loss_against_flops(found, planned, None, Path(folder) / "loss_against_flops.png"),
            plots.isoflop_curves(found, Path(folder) / "isoflop_curves.png"),
        ):
            run.log_file(path, "plots")
    print(f"\n{describe(found, planned)}\n", file=sys.stderr, flush=True)


def describe(found: Study, planned: Planned | None) -> str:
    """The fit and the plan in a few lines, as the study ends."""
    law, chosen = found.chosen.law, found.chosen
    lines = [
        f"law (N = {chosen.kind.name} parameters): L = {law.E:.3f} + {law.A:.4g}/N^{law.alpha:.3f} + "
        f"{law.B:.4g}/D^{law.beta:.3f} test bits per byte",
        *(f"  N = {name}: largest error predicting {fit.holdout}: {fit.holdout_error:.2%}"
          for name, fit in found.fits.items()),
    ]  # fmt: skip
    if found.exponent is not None:
        lines.append(f"IsoFLOP minima: N_opt ~ C^{found.exponent[1]:.2f}")
    if planned is not None:
        lines.append(
            f"planned: depth {planned.depth} ({planned.parameter_count:,} parameters), {planned.tokens:,} "
            f"tokens ({planned.tokens_per_parameter:.1f} per parameter), {planned.max_flops:.3g} FLOPs: "
            f"predicted {planned.predicted_test_bits_per_byte:.4f} test bits per byte "
            f"({planned.predicted_low:.4f}-{planned.predicted_high:.4f})"
        )
    if planned is not None and planned.data_constrained:
        lines.append(
            "  within one epoch: a smaller size would do better on this budget but read the corpus again"
        )
    return "\n".join(lines)


def trials_table(results: list[TrialResult]) -> str:
    header = ["point", "test bits/byte", "tokens", "FLOPs", "tokens/s", "state", "seconds"]
    names = ("test_bits_per_byte", "tokens_seen", "training_flops", "tokens_per_second")
    rows = [
        [r.trial.name, *(r.figures.get(name) for name in names),
         r.state + (f": {r.message}" if r.message else ""), round(r.seconds, 1)]
        for r in results
    ]  # fmt: skip
    return table(header, rows)
