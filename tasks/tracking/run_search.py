"""Runs found again in the store: one by its id (what it recorded), a flow run's by its Prefect tag (and
tagged afterwards). A parent's children are found by their `ParentRun`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tasks.tracking.session import TrackingSession

if TYPE_CHECKING:
    from tasks.params.schema import TrackingConfig


@dataclass(frozen=True)
class RecordedRun:
    """What a run recorded, as the store holds it."""

    run_id: str
    params: dict[str, str]
    metrics: dict[str, float]


def recorded_run(session: TrackingSession, run_id: str) -> RecordedRun | None:
    """The run `run_id` of the session's store; None when the store holds no such run."""
    try:
        run = session.client.get_run(run_id)
    except Exception:  # MLflow says "not found" in many kinds (and a malformed id in others)
        return None
    return RecordedRun(run_id, dict(run.data.params), dict(run.data.metrics))


def tag_flow_run(config: TrackingConfig, flow_run_id: str, tags: dict[str, str]) -> None:
    """`tags` on the run that records the Prefect flow run `flow_run_id` (its tag `prefect.flow_run_id`),
    when the parameter file's experiment holds one."""
    session = TrackingSession.open(config)
    runs = session.client.search_runs(
        [session.experiment_id], f"tags.`prefect.flow_run_id` = '{flow_run_id}'", max_results=1
    )
    for run in runs:
        for key, value in tags.items():
            session.client.set_tag(run.info.run_id, key, value)
