"""The run's record of its stages: states, outputs, figures; printed as one JSON line (a few lines in
words at a terminal) and kept as a Prefect markdown artifact.

Stages run in order. Past `--until`, or after a failure, the remaining stages are `skipped`.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flows.run_report import RunReport, StageLine
from gptcore.errors import first_line
from gptcore.tools.markdown import cell, table
from gptcore.tools.records import JSONObject
from tasks.caching import StageOutcome
from tasks.params.schema import STAGES

if TYPE_CHECKING:
    from tasks.stage import Stage
    from tasks.tracking import PipelineRecorder

log = logging.getLogger(__name__)


class PipelineReport:
    def __init__(
        self, until: str, title: str, stages: tuple[str, ...] = STAGES, params_path: str | None = None
    ) -> None:
        self.until = until
        self.title = title
        self.params_path = params_path  # the file the run read: what `gptpipe ui` is told in the last lines
        self.stages = stages  # in order: the pipeline's, or a fine-tune's (FINETUNE_STAGES)
        self.outcomes: dict[str, StageOutcome] = {}
        self.stopped: str | None = None  # why the remaining stages are skipped
        self.links: dict[str, str] = {}

    def stage(self, name: str, run: Callable[[], StageOutcome]) -> StageOutcome:
        """Run one stage unless the pipeline stopped or the stage lies past `--until`."""
        if self.stopped is not None:
            return self._skip(name, self.stopped)
        try:
            outcome = run()
        except BaseException as error:
            self.outcomes[name] = StageOutcome(name, "failed", message=first_line(error, 500))
            self.stopped = f"stage {name} failed"
            raise
        self.outcomes[name] = outcome
        if outcome.state == "skipped":
            self.stopped = outcome.message or f"stage {name} skipped"
        elif name == self.until:
            self.stopped = f"--until {self.until}"
        return outcome

    def run(self, stage: Stage[Any], tracking: PipelineRecorder) -> StageOutcome:
        """Run `stage` (`Stage.run`) unless the pipeline stopped or it lies past `--until`."""
        return self.stage(stage.name, lambda: stage.run(tracking))

    def _skip(self, name: str, reason: str) -> StageOutcome:
        outcome = StageOutcome(name, "skipped", message=reason)
        self.outcomes[name] = outcome
        return outcome

    def finish(self) -> None:
        """Mark every stage that never ran (after a failure) as skipped."""
        for name in self.stages:
            if name not in self.outcomes:
                self._skip(name, self.stopped or "not reached")

    def report(self) -> RunReport:
        lines = []
        for name in self.stages:
            outcome = self.outcomes.get(name) or StageOutcome(name, "skipped")
            lines.append(
                StageLine(
                    name=name,
                    state=outcome.state,
                    outputs=outcome.outputs,
                    figures=outcome.figures,
                    seconds=outcome.seconds,
                    message=outcome.message or None,
                )
            )
        return RunReport(stages=lines)

    def to_dict(self) -> JSONObject:
        return self.report().to_dict()

    def headline(self) -> dict[str, float]:
        """The figures a run is compared by (`RunReport.headline`)."""
        return self.report().headline()

    def print_json(self) -> None:
        sys.stdout.flush()
        print(json.dumps(self.to_dict(), default=str), flush=True)

    def print_end(self) -> None:
        """A few lines in words for a person at a terminal (`flows.closing_lines`), else the JSON line:
        for a pipe, `--json` and `GPTPIPE_JSON=1`."""
        from gptcore.tools.console import wants_progress_bar

        if not wants_progress_bar():
            self.print_json()
            return
        from flows.closing_lines import closing_lines

        sys.stdout.flush()
        print("\n".join(closing_lines(self.report(), self.links, self.params_path)), flush=True)

    def markdown(self) -> str:
        rows = []
        for name in self.stages:
            outcome = self.outcomes.get(name) or StageOutcome(name, "skipped")
            figures = ", ".join(f"{key}={cell(value)}" for key, value in outcome.figures.items())
            note = f" ({outcome.message})" if outcome.message else ""
            rows.append([name, f"{outcome.state}{note}", cell(outcome.seconds, ".2f"), figures])
        lines = [f"# {self.title}", "", table(["stage", "state", "seconds", "figures"], rows)]
        if self.links:
            lines += ["", *(f"- {label}: {target}" for label, target in self.links.items())]
        return "\n".join(lines) + "\n"

    def close(self, tracking: PipelineRecorder, key: str) -> None:
        """The flow's end, however it ends: stages never reached marked skipped, failed ones recorded
        (their child runs end FAILED with the reason), the parent run ended, the summary published as
        the artifact `key` and printed: the last JSON line, or a few lines in words at a terminal."""
        self.finish()
        for outcome in self.outcomes.values():
            if outcome.state == "failed":
                tracking.record_stage(outcome)
        tracking.finish(self)
        self.publish_artifact(key=key)
        self.print_end()

    def publish_artifact(self, key: str) -> None:
        try:
            from prefect.artifacts import create_markdown_artifact

            create_markdown_artifact(self.markdown(), key=key, description=self.title)
        except Exception as error:  # the summary artifact is a convenience, never a reason to fail a run
            log.warning("summary artifact not created: %s", error)
