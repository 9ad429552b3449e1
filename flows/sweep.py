"""The `sweep` flow: trials of the pipeline over a grid or a random search (`tasks.params.sweep`), recorded
under one MLflow run.

The data stages run once first (`end_to_end` up to the device check); each trial is then `gptpipe run
--until evaluate` with its overrides, in a process of its own, so every trial takes the data stages from
the cache, trains into its own checkpoint directory (its fingerprint differs) and is recorded as a child
run of the sweep's run with the swept keys as `sweep.<key>` params. Up to `parallel` trials run at once;
the device's concurrency slot (`tasks.device_slot`) still lets only one of them train or evaluate on a
machine's device at a time. Run again, a sweep takes finished trials from the cache and resumes an
interrupted one from its checkpoint. Each trial's evaluate stage registers its model, so the best one
holds `@champion`.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prefect import flow

from flows.run_report import RunReport
from flows.trials import TableRun, TrialResult, benchmark_columns, run_trial, sweep_table
from gptcore.tools.records import JSONObject
from tasks.params.schema import PipelineParams, SweepConfig
from tasks.params.sweep import Trial
from tasks.tracking import ParentRun

TABLE_ARTIFACT = "sweep.json"


@flow(name="sweep", log_prints=False, persist_result=False)
def sweep(
    params_path: str,
    overrides: list[str] | None = None,
    grid: dict[str, Any] | None = None,
    random: int | None = None,
    seed: int | None = None,
    parallel: int | None = None,
    work_pool: str | None = None,
) -> JSONObject:
    """Trials of the pipeline over the parameter file's `sweep:` section, or `grid`/`random`/`seed`
    given here; the data stages once, then each trial in its own process, `parallel` at a time, or as
    runs of a deployment on `work_pool` (`flows.sweep_pool`)."""
    from flows.environment.prefect_settings import hide_user_error_tracebacks
    from tasks.params.loading import load_params
    from tasks.params.sweep import expand, validate_trials, with_options

    hide_user_error_tracebacks()
    base = list(overrides or [])
    params = load_params(params_path, base)
    settings = with_options(params.sweep, grid=grid, random=random, seed=seed, parallel=parallel)
    trials = expand(settings)
    validate_trials(Path(params_path), base, trials)  # every trial checked before anything runs
    run = _open_sweep_run(params, trials, settings)
    parent = run.run_id
    results = [TrialResult(trial) for trial in trials]
    try:
        data_stages(params_path, base, parent)
        results = run_trials(params_path, base, trials, run, settings.parallel, work_pool)
    finally:
        _close_sweep_run(run, results)
    failed = [result for result in results if result.state != "completed"]
    columns = benchmark_columns(results)
    summary: JSONObject = {
        "sweep_run_id": parent,
        "trials": [result.row(columns).to_dict() for result in results],
    }
    if failed:
        summary["failed"] = [result.trial.name for result in failed]
    return summary


def data_stages(params_path: str, base: list[str], parent: str | None) -> RunReport:
    """The data stages (up to the device check) once, as the child run `data` of `parent`: every trial
    then takes them from the cache."""
    from flows.pipeline import end_to_end

    data_run = {"parent_run_id": parent, "name": "data", "kind": "sweep-data"}
    report = RunReport.model_validate(end_to_end(params_path, base, until="device", trial=data_run))
    if any(stage.state == "failed" for stage in report.stages):
        raise RuntimeError("the data stages failed; no trial was started")
    return report


def run_trials(
    params_path: str,
    base: list[str],
    trials: list[Trial],
    run: ParentRun,
    parallel: int | None = None,
    work_pool: str | None = None,
) -> list[TrialResult]:
    """Every trial, each as `gptpipe run --until evaluate` and a child run of `run`: `parallel` at a
    time here (default: one per device), or as runs of a deployment on `work_pool` (`flows.sweep_pool`)."""
    if work_pool:
        from flows.sweep_pool import run_trials_on_pool

        where = str(Path(params_path).resolve())  # the workers run from this checkout's folder
        return run_trials_on_pool(work_pool, where, base, trials, run)
    return _run_trials(params_path, base, trials, run.run_id, parallel or _devices())


def _devices() -> int:
    import torch

    return max(1, torch.cuda.device_count())


def _run_trials(
    params_path: str, base: list[str], trials: list[Trial], parent: str | None, parallel: int
) -> list[TrialResult]:
    cancel = threading.Event()
    with ThreadPoolExecutor(parallel, thread_name_prefix="trial") as pool:
        futures = [pool.submit(run_trial, params_path, base, trial, parent, cancel) for trial in trials]
        try:
            return [future.result() for future in futures]
        except BaseException:
            cancel.set()  # Ctrl-C or SIGTERM: every trial's process tree stops
            for future in futures:
                future.cancel()
            raise


def _open_sweep_run(params: PipelineParams, trials: list[Trial], settings: SweepConfig) -> ParentRun:
    keys = list(settings.grid)
    run = ParentRun.open(
        params.tracking,
        f"sweep-{len(trials)}-trials-{'-'.join(key.split('.')[-1] for key in keys)}",
        {"kind": "sweep", "sweep.keys": ",".join(keys), "sweep.trials": str(len(trials))},
    )
    run.log_params({f"sweep.{key}": json.dumps(values) for key, values in settings.grid.items()})
    return run


def _close_sweep_run(run: ParentRun, results: list[TrialResult]) -> None:
    """The table printed, on the sweep's run (`log_table`, `sweep.md`) and as a Prefect table artifact."""
    done = all(result.state == "completed" for result in results)
    rows = [result.row(benchmark_columns(results)).to_dict() for result in results]
    where = TableRun(run.session, run.run_id, "Sweep", TABLE_ARTIFACT, "gptpipe-sweep")
    where.publish(rows, sweep_table(results), done, "the sweep's trials and their figures")
