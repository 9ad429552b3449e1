"""`gptpipe run`: the end-to-end pipeline for one parameter file (iteration 1 without arguments)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from pydantic import ValidationError

from flows.cli.options import json_lines_only, resolve_params
from gptcore.errors import ConfigError
from tasks.params.loading import choice
from tasks.params.schema import STAGES, PipelineParams


def run(
    params: Path | None = typer.Option(None, "--params", help="parameter file (default: iteration 1's)"),
    iteration: int | None = typer.Option(None, "--iteration", help="use params/iteration_N.yaml"),
    overrides: list[str] = typer.Option([], "--set", help="override a parameter: key.path=value"),
    until: str = typer.Option(STAGES[-1], "--until", help=f"last stage to run: {', '.join(STAGES)}"),
    trial: str | None = typer.Option(None, "--trial", hidden=True, help="a sweep's trial, as JSON"),
    json_only: bool = typer.Option(False, "--json", help="no progress bar, also on a terminal"),
) -> None:
    """Run tokenizer → tokens → device → smoke → full → evaluate → export → quantize, taking unchanged
    stages from the cache."""
    choice("--until", until, STAGES)
    json_lines_only(json_only)
    params_path, checked = resolve_params(params, iteration, overrides)  # checked before anything starts
    if checked.evaluate.benchmarks and STAGES.index(until) >= STAGES.index("evaluate"):
        from gptcore.eval.benchmarks import check_benchmarks

        check_benchmarks(checked.evaluate)  # the harness and every task there, before training
    if checked.full.init_from is not None:
        _check_start(checked, params_path)
    if STAGES.index(until) >= STAGES.index("full"):
        _check_full_can_run(checked, params_path)
    _start_prefect(checked)
    from flows.pipeline import end_to_end

    as_trial = json.loads(trial) if trial else None  # `gptpipe sweep` runs each trial as `gptpipe run`
    end_to_end(params_path=str(params_path), overrides=list(overrides), until=until, trial=as_trial)


def sweep_command(
    params: Path | None = typer.Option(None, "--params", help="parameter file (default: iteration 1's)"),
    iteration: int | None = typer.Option(None, "--iteration", help="use params/iteration_N.yaml"),
    overrides: list[str] = typer.Option(
        [], "--set", help="override a parameter in every trial: key.path=value"
    ),
    grid: list[str] = typer.Option(
        [], "--grid", help="a swept key: key.path=a,b,c (every combination) or key.path=low..high (--random)"
    ),
    random: int | None = typer.Option(
        None, "--random", min=1, help="N random combinations instead of the grid"
    ),
    seed: int | None = typer.Option(None, "--seed", help="the random combinations' seed"),
    parallel: int | None = typer.Option(None, "--parallel", min=1, help="trials at once (default: devices)"),
    work_pool: str | None = typer.Option(
        None, "--work-pool", help="run each trial as a deployment run on this Prefect work pool"
    ),
) -> None:
    """Sweep: the data stages once, then smoke + full + evaluate per trial (a grid over any keys --set
    takes, or --random N), each a child run of one MLflow sweep run; prints the trials' table."""
    from flows.trials import gptpipe_program
    from tasks.params.sweep import expand, parse_grid, validate_trials

    params_path, checked = resolve_params(params, iteration, overrides)
    swept = parse_grid(grid) if grid else None
    update = {"grid": swept, "random": random, "seed": seed}
    settings = checked.sweep.model_copy(
        update={key: value for key, value in update.items() if value is not None}
    )
    validate_trials(params_path, list(overrides), expand(settings))  # every trial, before anything starts
    if work_pool is None:
        gptpipe_program()  # the trials' program too
    _start_prefect(checked)
    from flows.sweep import sweep

    summary = sweep(str(params_path), list(overrides), swept, random, seed, parallel, work_pool)
    print(json.dumps(summary, default=str), flush=True)
    if summary.get("failed"):
        raise typer.Exit(1)


def finetune_command(
    params: Path = typer.Option(
        ..., "--params", help="a fine-tune's parameter file (params/finetune_*.yaml)"
    ),
    model: str | None = typer.Option(
        None, "--model", help="the base: models:/NAME@ALIAS, models:/NAME/VERSION or a model folder"
    ),
    overrides: list[str] = typer.Option([], "--set", help="override a parameter: key.path=value"),
    json_only: bool = typer.Option(False, "--json", help="no progress bar, also on a terminal"),
) -> None:
    """Fine-tune a trained model on new text: base → tokens (the base's tokenizer) → device → smoke →
    finetune → merge → evaluate (registered as gptpipe-iteration-N-<name>) → before-after; LoRA and full
    fine-tuning side by side unless finetune.compare is false."""
    json_lines_only(json_only)
    overrides = [*overrides, *([f"finetune.model={model}"] if model else [])]
    params_path, checked = resolve_params(params, None, overrides)
    import tempfile

    from tasks.stages.finetune import check_base, finetune_section

    finetune_section(checked, str(params_path))
    with tempfile.TemporaryDirectory(prefix="gptpipe-base-") as scratch:
        check_base(checked, Path(scratch), str(params_path))  # architecture, tokenizer, adapters: first
    _start_prefect(checked)
    from flows.finetune import finetune

    summary = finetune(str(params_path), overrides)
    print(json.dumps(summary, default=str), flush=True)
    if summary.get("failed"):
        raise typer.Exit(1)


def scale_command(
    params: Path | None = typer.Option(None, "--params", help="parameter file (default: iteration 1's)"),
    iteration: int | None = typer.Option(None, "--iteration", help="use params/iteration_N.yaml"),
    overrides: list[str] = typer.Option(
        [], "--set", help="override a parameter in every run: key.path=value"
    ),
    depths: str | None = typer.Option(None, "--depths", help="the size dial's depths, e.g. 1,2,3,4,5"),
    budgets: str | None = typer.Option(None, "--budgets", help="training FLOPs budgets, e.g. 5e12,1e13,2e13"),
    target_flops: float | None = typer.Option(
        None, "--target-flops", help="the planned run's budget (default: 4x the largest budget)"
    ),
    target_seconds: float | None = typer.Option(
        None, "--target-seconds", help="or its seconds of training here, priced by the grid's FLOP/s"
    ),
    within_one_epoch: bool = typer.Option(
        False, "--within-one-epoch", help="plan the best size that reads the corpus at most once, not refuse"
    ),
    write: Path | None = typer.Option(None, "--write", help="the planned parameter file's path"),
    parallel: int | None = typer.Option(None, "--parallel", min=1, help="runs at once (default: devices)"),
    work_pool: str | None = typer.Option(
        None, "--work-pool", help="run each point as a deployment run on this Prefect work pool"
    ),
) -> None:
    """Scaling study: every depth x budget trained and tested through the cached stages, the law
    L(N, D) fitted, plots and the fit on one MLflow run, and the run a target budget buys written as a
    parameter file (or one line saying why the points cannot claim it)."""
    from flows.trials import gptpipe_program
    from tasks.params.scale import grid_trials, shared_overrides, study_settings, target_budget
    from tasks.params.sweep import validate_trials

    params_path, checked = resolve_params(params, iteration, overrides)
    given = {
        "depths": _numbers("--depths", depths, int), "budgets": _numbers("--budgets", budgets, float),
        "target_flops": target_flops, "target_seconds": target_seconds,
        "write": str(write) if write else None, "within_one_epoch": within_one_epoch or None,
    }  # fmt: skip
    try:
        settings = study_settings(checked.scale, given)
    except ValidationError as error:
        raise ConfigError(
            f"{params_path}: scale: {error.errors()[0]['msg'].removeprefix('Value error, ')}"
        ) from None
    target_budget(settings)  # a target the grid cannot claim: refused before anything trains
    validate_trials(params_path, [*overrides, *shared_overrides(checked, settings)], grid_trials(settings))
    if work_pool is None:
        gptpipe_program()  # the trials' program too
    _start_prefect(checked)
    from flows.scale import scale

    summary = scale(str(params_path), list(overrides), given, parallel, work_pool)
    print(json.dumps(summary, default=str), flush=True)


def _numbers(flag: str, raw: str | None, kind: type) -> list | None:
    """`1,2,3` as numbers of `kind`, or a one-line error naming the flag and the value."""
    if raw is None:
        return None
    try:
        return [kind(float(part)) if kind is int else kind(part) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {raw!r}: expected numbers separated by commas") from None


def _check_full_can_run(checked: PipelineParams, params_path: Path) -> None:
    """Refuse before the data stages a run whose full training this machine would refuse after them
    (iterations 2 and 3 on a CPU read about a billion tokens first): the run's own rule, asked now, before
    anything imports Prefect (`_start_prefect` sets its project settings first)."""
    import torch

    from tasks.training_launch import launch_spec

    launch_spec(checked)  # on several processes: the command they would run under (GPTPIPE_PYTHON)

    if checked.full_refusal("cuda" if torch.cuda.is_available() else "cpu") is not None:
        raise ConfigError(
            f"{params_path}: full training needs CUDA (full.require_cuda: true) and this machine has none; "
            "nothing was started. Add --until smoke to build the data and prove the settings here, or set "
            "runtime.device=cpu with a bounded full.max_steps to train on the CPU anyway."
        )


def _check_start(checked: PipelineParams, params_path: Path) -> None:
    """`full.init_from`'s model fetched and checked (architecture, tokenizer) before anything starts."""
    import tempfile

    from tasks.stages.start_model import check_start, start_model

    with tempfile.TemporaryDirectory(prefix="gptpipe-start-") as scratch:
        check_start(checked, start_model(checked), Path(scratch), str(params_path))


def _start_prefect(checked: object) -> None:
    """Prefect's project settings and a temporary server (unless one is configured), started while the
    imports every run needs load and the MLflow store is opened and checked."""
    from flows.environment.gc_tuning import bulk_imports
    from flows.environment.prefect_settings import TemporaryServer, apply_project_settings

    apply_project_settings()
    server = TemporaryServer()
    server.start()
    with bulk_imports():
        import prefect.flow_engine  # noqa: F401  (otherwise imported when the flow starts)

        import flows.pipeline  # noqa: F401
        from gptcore.runtime import device as runtime  # noqa: F401  (torch)
        from tasks.tracking import TrackingSession

        TrackingSession.open(checked.tracking)  # checked now; the flow's own open reuses MLflow's store
    server.wait()
