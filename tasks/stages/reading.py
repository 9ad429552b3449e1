"""What the stages after training read: one checkpoint of the trained (or merged) run, by the rule every
reader follows, and its digest, which is part of their cache keys (a retrained checkpoint misses)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tasks.params.schema import PipelineParams
from tasks.results import CheckpointsResult
from tasks.stage import announce


@dataclass(frozen=True)
class ReadCheckpoint:
    checkpoint: Path
    digest: str  # its sha256, as the stage that wrote it recorded it (checked when taken from the cache)

    @classmethod
    def of(cls, trained: CheckpointsResult, checkpoint: Path) -> ReadCheckpoint:
        from gptcore.tools.fingerprint import sha256_file

        return cls(checkpoint, trained.files.get(str(checkpoint)) or sha256_file(checkpoint))

    @classmethod
    def evaluated(cls, params: PipelineParams, trained: CheckpointsResult) -> ReadCheckpoint:
        """The checkpoint `evaluate.checkpoint` names (`evaluated_checkpoint`)."""
        return cls.of(trained, evaluated_checkpoint(params, trained))


def evaluated_checkpoint(params: PipelineParams, trained: CheckpointsResult) -> Path:
    """The checkpoint `evaluate.checkpoint` names in the trained (or merged) folder, by the rule every
    reader follows (`gptcore.checkpoint.load.whole_checkpoint`): one missing or damaged is passed over
    for final, then the newest whole one, with a line saying so, so a retry never fails on it forever."""
    from gptcore.checkpoint.load import whole_checkpoint

    path, passed_over = whole_checkpoint(Path(trained.run_directory), params.evaluate.checkpoint)
    if passed_over:
        announce(f"evaluate: {'; '.join(passed_over)}; evaluating {path.name} instead")
    return path
