"""What a failed or crashed end-to-end run leaves for the person who reruns it: which stage failed, why
(one line), the latest checkpoint full training would resume from, and the command that resumes it,
as a Prefect markdown artifact and as tags of the run's MLflow record (`failure.*`).

Installed as the flow's `on_failure` and `on_crashed` hooks: they run after the flow ended, read what
they need from Prefect (the flow run's parameters and its failed task run) and from the parameter file,
and never raise: a hook that fails is a warning, the run's own failure stays the story.
"""

from __future__ import annotations

import logging
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptcore.errors import first_line

log = logging.getLogger(__name__)
# Prefect's wrapping of an exception in a state message: "Flow run encountered an exception: TrainingError: "
PREFECT_PREFIX = re.compile(r"^(?:Flow|Task) run encountered an exception:?\s*(?:[A-Za-z_][\w.]*:\s*)?")


@dataclass(frozen=True)
class Failure:
    stage: str  # the stage whose task failed, or "before any stage"
    reason: str  # one line
    checkpoint: str  # the latest full-training checkpoint of this parameter file, or "none"
    resume: str  # the command that picks the run up again
    state: str  # Failed or Crashed

    def tags(self) -> dict[str, str]:
        return {f"failure.{name}": value for name, value in self.__dict__.items()}

    def markdown(self) -> str:
        return "\n".join(
            [
                f"# The run {self.state.lower()} in stage `{self.stage}`",
                "",
                f"- why: {self.reason}",
                f"- latest checkpoint: `{self.checkpoint}`",
                f"- resume with: `{self.resume}` (finished stages come from the cache; full training",
                "  resumes from its latest checkpoint)",
            ]
        )


def describe_failure(
    parameters: dict[str, Any], failed_task: str | None, message: str, state: str
) -> Failure:
    """The failure of a run with these flow parameters, its failed task run's name and state message."""
    from tasks.tracking.store import redact

    params_path = parameters.get("params_path") or "params/iteration_1.yaml"
    overrides = list(parameters.get("overrides") or [])
    command = ["gptpipe", "run", "--params", str(params_path)]
    command += [item for assignment in overrides for item in ("--set", _shown(assignment))]
    if parameters.get("until"):
        command += ["--until", str(parameters["until"])]
    stage = failed_task.rsplit("-", 1)[0] if failed_task else "before any stage"
    first = first_line(message) or state
    reason = redact(PREFECT_PREFIX.sub("", first))[:500]
    checkpoint = str(_latest_checkpoint(params_path, overrides) or "none")
    return Failure(stage, reason, checkpoint, redact(shlex.join(command)), state)


def _shown(assignment: str) -> str:
    """A `--set key=value` as the resume command may show it: a secret-named key's value as `***`."""
    from tasks.tracking.store import secret_key

    key, equals, _ = assignment.partition("=")
    return f"{key}=***" if equals and secret_key(key) else assignment


def _latest_checkpoint(params_path: str, overrides: list[str]) -> Path | None:
    from gptcore.checkpoint.files import latest_checkpoint
    from tasks.params.loading import load_params

    params = load_params(params_path, overrides)
    runs = Path(params.paths.checkpoint_root).resolve().glob(f"iteration-{params.iteration}-full-*")
    found = [path for path in (latest_checkpoint(run) for run in runs) if path is not None]
    return max(found, key=lambda path: path.stat().st_mtime, default=None)


def record_failure(flow: Any, flow_run: Any, state: Any) -> None:
    """`on_failure` / `on_crashed`: the markdown artifact and the MLflow tags of this run's failure."""
    try:
        failure = describe_failure(
            flow_run.parameters, _failed_task(flow_run.id), state.message or "", state.name
        )
        _publish(failure, flow_run)
    except Exception as error:  # a hook never turns one failure into two
        log.warning("the failure record was not written: %s", error)


def _failed_task(flow_run_id: Any) -> str | None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    failed = [run for run in runs if run.state is not None and run.state.type.value in ("FAILED", "CRASHED")]
    return max(failed, key=lambda run: run.state.timestamp).name if failed else None


def _publish(failure: Failure, flow_run: Any) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactCreate

    from tasks.params.loading import load_params
    from tasks.tracking.run_search import tag_flow_run

    # The hook runs after the flow run's context is gone: the artifact names its flow run itself (through
    # `create_markdown_artifact` it would be created outside any run, which Prefect warns is deprecated).
    artifact = ArtifactCreate(
        type="markdown",
        key="gptpipe-failure",
        description=f"{failure.state}: {failure.stage}",
        flow_run_id=flow_run.id,
        data=failure.markdown(),
    )
    with get_client(sync_client=True) as client:
        client.create_artifact(artifact)
    parameters = flow_run.parameters
    params = load_params(parameters.get("params_path"), list(parameters.get("overrides") or []))
    tag_flow_run(params.tracking, str(flow_run.id), failure.tags())
