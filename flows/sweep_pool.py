"""A sweep's trials on a Prefect work pool (`gptpipe sweep --work-pool NAME`): each trial is a run of the
`end-to-end/sweep-trial` deployment, so every machine with a worker on the pool takes trials.

The deployment is created (or updated) from this checkout when the sweep starts: its flow is
`flows/pipeline.py:end_to_end` loaded from this folder, so a worker on another machine needs the same
checkout at the same path (or a shared file system), the same MLflow store (`tracking.uri` pointing at a
tracking server) and the same Prefect server. The trials are submitted at once; the workers take them as
they have room (`prefect worker start --pool NAME --limit 1`: one trial per worker at a time). The sweep
waits for every trial's flow run and builds its table from the trials' MLflow runs (each trial records
its headline figures there), so no result has to travel back from the workers' machines.
"""

from __future__ import annotations

import sys
import time
from uuid import UUID

from flows.trials import TrialResult
from gptcore.errors import first_line
from tasks.params.sweep import Trial
from tasks.tracking import ParentRun

DEPLOYMENT = "sweep-trial"
POLL_SECONDS = 2.0
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def ensure_deployment(pool: str) -> str:
    """The trial deployment on `pool`, from this checkout; its `flow/deployment` name."""
    from prefect import Flow

    from flows.environment.prefect_settings import PROJECT_ROOT

    flow = Flow.from_source(source=str(PROJECT_ROOT), entrypoint="flows/pipeline.py:end_to_end")
    flow.deploy(
        name=DEPLOYMENT,
        work_pool_name=pool,
        build=False,
        push=False,
        print_next_steps=False,
        ignore_warnings=True,
        description="one trial of a gptpipe sweep (gptpipe sweep --work-pool)",
        tags=["gptpipe", "sweep-trial"],
    )
    return f"end-to-end/{DEPLOYMENT}"


def run_trials_on_pool(
    pool: str, params_path: str, base: list[str], trials: list[Trial], sweep_run: ParentRun
) -> list[TrialResult]:
    """Submit every trial to the pool, wait for all of them, read their figures from MLflow."""
    from prefect.deployments import run_deployment

    name = ensure_deployment(pool)
    submitted = {}
    for trial in trials:
        parameters = {
            "params_path": params_path,
            "overrides": [*base, *trial.overrides()],
            "until": "evaluate",
            "trial": {"parent_run_id": sweep_run.run_id, "name": trial.name, "values": trial.values},
        }
        run = run_deployment(name, parameters=parameters, timeout=0, flow_run_name=trial.name)
        submitted[trial.name] = (trial, run.id, time.time())
        print(
            f"[{trial.name}] submitted to work pool {pool} as flow run {run.id}", file=sys.stderr, flush=True
        )
    return [_wait(trial, run_id, started, sweep_run) for trial, run_id, started in submitted.values()]


def _wait(trial: Trial, run_id: UUID, started: float, sweep_run: ParentRun) -> TrialResult:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(run_id)
            if run.state is not None and run.state.type.value in FINAL:
                break
            time.sleep(POLL_SECONDS)
    result = TrialResult(trial, seconds=time.time() - started)
    result.state = "completed" if run.state.type.value == "COMPLETED" else "failed"
    if result.state == "failed":
        result.message = first_line(run.state.message or run.state.name, 300)
    # The headline figures the trial's own MLflow run holds (its pipeline recorder logged them).
    result.figures = sweep_run.child_metrics(f"{trial.name}-")
    print(f"[{trial.name}] {run.state.name} (flow run {run_id})", file=sys.stderr, flush=True)
    return result
