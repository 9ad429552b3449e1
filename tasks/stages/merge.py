"""A fine-tune's merge stage: its checkpoints as plain models, what every later stage reads: a (Q)LoRA
run's final and best with the adapters folded into the weights (`<run>/merged`, the evaluated one's
adapters alone in `<run>/adapter`), a full fine-tune's as trained. Logged as models of the stage's run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.caching import StageOutcome
from tasks.results import CheckpointsResult, file_record
from tasks.stage import Stage, announce
from tasks.stages.finetune import finetune_section
from tasks.stages.full import FullResult

if TYPE_CHECKING:
    from tasks.tracking import PipelineRecorder


class MergeResult(CheckpointsResult):
    """A fine-tune's checkpoints as plain models: a LoRA run's merged into `<run>/merged` (its adapters
    alone in `adapter`), a full fine-tune's as trained (`merged` false: nothing to merge)."""

    merged: bool
    checkpoints: list[str]  # the plain checkpoints (final, best): merged, or as trained
    adapter: str | None = None  # adapter.safetensors, beside it adapter_config.json


@dataclass(frozen=True, kw_only=True)
class Merge(Stage[MergeResult]):
    """The fine-tune's trained checkpoints as plain models."""

    result_type = MergeResult
    name: str = "merge"
    trained: FullResult

    def key(self) -> tuple[Any, ...]:
        method = finetune_section(self.params).method
        return ("merge", self.trained.files, method, self.params.evaluate.checkpoint)

    def compute(self, fingerprint: str | None) -> MergeResult:
        from gptcore.checkpoint.files import damage
        from gptcore.checkpoint.load import whole_checkpoint
        from gptcore.checkpoint.merge import MERGED

        directory = Path(self.trained.run_directory)
        # by the rule every reader follows: the evaluated one whole (else what it falls back to), and final
        # and best where they are whole, so a kill mid-write never fails this stage for good
        evaluated, passed_over = whole_checkpoint(directory, self.params.evaluate.checkpoint)
        if passed_over:
            announce(f"merge: {'; '.join(passed_over)}; taking {evaluated.name} instead")
        named = [directory / f"{name}.pt" for name in ("final", "best")]
        whole = (path for path in named if path.is_file() and damage(path) is None)
        trained = list(dict.fromkeys([*whole, evaluated]))
        if finetune_section(self.params).adapters() is None:
            plain = [str(path) for path in trained]
            announce("merge: full fine-tuning trained the weights themselves; nothing to merge")
            return MergeResult(
                fingerprint=fingerprint, run_directory=str(directory), merged=False, checkpoints=plain,
                files=file_record(*plain), outputs=plain, figures={"merged_checkpoints": 0},
            )  # fmt: skip
        done = merge_adapted(trained, directory / MERGED, evaluated, directory / "adapter")
        merged, adapter, outputs = done.checkpoints, done.adapter, done.outputs()
        announce(
            f"merge: {len(merged)} checkpoint(s) merged into {directory / MERGED}; adapters in {adapter}"
        )
        return MergeResult(
            fingerprint=fingerprint, run_directory=str(directory / MERGED), merged=True,
            checkpoints=[str(path) for path in merged], adapter=str(adapter), files=file_record(*outputs),
            outputs=[str(path) for path in outputs], figures={"merged_checkpoints": len(merged)},
        )  # fmt: skip

    def record(self, outcome: StageOutcome, tracking: PipelineRecorder) -> StageOutcome:
        """LoRA's merged checkpoints logged as models of the stage's run (training logged the rest)."""
        result = outcome.result
        if outcome.state == "completed" and isinstance(result, MergeResult) and result.merged:
            tracking.log_models(self.name, [Path(path) for path in result.checkpoints])
        tracking.record_stage(outcome)
        return outcome


@dataclass(frozen=True)
class Merged:
    """A LoRA run's checkpoints merged (`merge_adapted`): the plain checkpoints, and the adapters alone."""

    checkpoints: list[Path]  # each adapted checkpoint with its adapters folded into its weights
    adapter: Path  # adapter.safetensors, beside it adapter_config.json and PEFT's folder

    def outputs(self) -> list[Path]:
        from gptcore.checkpoint.merge import ADAPTER_CONFIG, PEFT
        from gptcore.finetune.peft import PEFT_CONFIG, PEFT_WEIGHTS

        peft = self.adapter.with_name(PEFT)
        pair = [self.adapter, self.adapter.with_name(ADAPTER_CONFIG)]
        return [*self.checkpoints, *pair, peft / PEFT_CONFIG, peft / PEFT_WEIGHTS]


def merge_adapted(checkpoints: list[Path], folder: Path, adapted: Path, adapter_folder: Path) -> Merged:
    """What the merge stage and `gptpipe merge` both do: each of a LoRA run's `checkpoints` as a plain one
    in `folder` (`gptcore.checkpoint.merge`), and the adapters of `adapted` alone in `adapter_folder`."""
    from gptcore.checkpoint.merge import merge_checkpoint, write_adapter

    merged = [merge_checkpoint(path, folder) for path in checkpoints]
    return Merged(merged, write_adapter(adapted, adapter_folder))
