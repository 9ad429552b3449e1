"""The one way a training starts: `gptpipe train`, the smoke and full stages, a fine-tune's trainings and
(through the stages) a sweep's trials all call `launch_training`.

It builds the job from the parameter file (`tasks.params.jobs.train_job`), with the MLflow run's live
metadata so every checkpoint carries the run id, and trains it in this process (which may be one rank
of a torchrun the user started) or on the processes of a `LaunchSpec` under torchrun
(`gptcore.train.multiprocess.launch_job`), whose rank 0 events come back into the callbacks here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gptcore.distributed.torchrun import LaunchSpec
from gptcore.errors import TrainingError
from gptcore.train.callbacks import TrainingCallback
from gptcore.train.records import SummaryRecord
from tasks.params.jobs import full_world_size, train_job
from tasks.params.schema import PipelineParams, TrainingStage


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def launch_spec(
    params: PipelineParams, topology: dict[str, str | int | None] | None = None
) -> LaunchSpec | None:
    """The torchrun processes a training runs on: `runtime.nproc` per node and the `topology` flags
    (`nnodes`, `node_rank`, `rdzv_*`); None when it trains in this process (one process asked for, or
    this one is a rank of a torchrun already). GPTPIPE_PYTHON, which the processes would run under, is
    checked here, before anything starts."""
    from gptcore.distributed.torchrun import python_program, under_torchrun

    if under_torchrun():
        return None
    given = {key: value for key, value in (topology or {}).items() if value is not None}
    spec = LaunchSpec(nproc_per_node=full_world_size(params), **given)
    if not spec.needs_torchrun:
        return None
    python_program()
    return spec


def launch_training(
    params: PipelineParams,
    stage: TrainingStage,
    callbacks: list[TrainingCallback],
    spec: LaunchSpec | None = None,
    metadata: dict[str, str] | None = None,
    on_text: Callable[[str], None] = _stderr,
    **job_fields: Any,
) -> SummaryRecord | None:
    """Train the `stage` section of `params` with `job_fields` (`TrainJob`'s: token sources, checkpoint
    folder, resume...); `metadata` joins what the checkpoints carry. Returns the run's summary (None on a
    node of a multi-node job that does not hold rank 0); a launch whose ranks failed is a TrainingError
    with the failing rank's exit code."""
    from gptcore.distributed.group import process_group
    from gptcore.runtime.device import resolve_device
    from gptcore.train.callbacks import CallbackList
    from gptcore.train.multiprocess import launch_job
    from gptcore.train.trainer import train
    from tasks.tracking import open_training_run, training_metadata

    carried = training_metadata(callbacks)  # live: the MLflow run id lands in it when the run opens
    carried.update(metadata or {})
    if spec is None:
        with process_group(resolve_device(params.runtime.device)) as world:  # a no-op outside torchrun
            job = train_job(
                params, stage, metadata=carried, world_size=world.world_size, rank=world.rank, **job_fields
            )
            return train(job, CallbackList(callbacks))
    if spec.nnodes == 1:  # this node holds rank 0: open the run now, so every checkpoint carries its id
        resumed = job_fields.get("checkpoint_directory") if job_fields.get("resume") else None
        open_training_run(callbacks, Path(resumed) if resumed else None)
    job = train_job(params, stage, metadata=carried, **job_fields)
    on_text(f"launching {spec.nproc_per_node} process(es) per node under torchrun")
    code, summary, failure = launch_job(job, spec, callbacks, on_text=on_text)
    if code != 0:
        processes = spec.nproc_per_node * spec.nnodes
        reason = failure or "see the ranks' output above"
        raise TrainingError(
            f"{stage} training on {processes} processes failed with exit code {code}: {reason}",
            exit_code=code,
        )
    return summary
