"""The export stage: the evaluated checkpoint as a Hugging Face folder (`export.hf: true`): GPT-2's
layout, or Llama's / Qwen3's for the modern recipe; cached on the checkpoint's content hash and the
export code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptcore.export.card import CardFacts
from tasks.results import StageResult, file_record
from tasks.stage import announce
from tasks.stages.evaluate import AfterEvaluation
from tasks.stages.training import run_directory


class ExportResult(StageResult):
    folder: str  # the Hugging Face folder
    checkpoint: str  # the checkpoint exported


@dataclass(frozen=True, kw_only=True)
class Export(AfterEvaluation[ExportResult]):
    """Write the Hugging Face folder of the evaluated checkpoint with the tokenizer its token files were
    made with."""

    result_type = ExportResult
    name: str = "export"

    def key(self) -> tuple[Any, ...]:
        return ("export-hf", self.read.digest)

    def skip_reason(self) -> str | None:
        return None if self.params.export.hf else "export.hf is off in the parameter file"

    def compute(self, fingerprint: str | None) -> ExportResult:
        into = run_directory(self.params, "export-hf", fingerprint)
        tokenizer = Path(self.tokens.tokenizer_path)
        folder = export_checkpoint(self.read.checkpoint, into, tokenizer, force=True, facts=self.card_facts())
        files = sorted(path for path in folder.iterdir() if path.is_file())
        announce(f"export: a Hugging Face folder in {folder}")
        return ExportResult(
            fingerprint=fingerprint,
            folder=str(folder),
            checkpoint=str(self.read.checkpoint),
            files=file_record(*files),
            outputs=[str(folder)],
            figures={"format": "hf", "files": len(files)},
        )

    def card_facts(self) -> CardFacts:
        """The model card's facts from this run's records: the evaluation, the test split, the corpus."""
        from gptcore.data.corpus import describe
        from tasks.tracking.models.registry import registered_name
        from tasks.tracking.models.test_split import TEST_SPLIT, split_tags

        held_out = self.evaluated.evaluation
        facts: dict[str, str | int | float] = {"iteration": self.params.iteration, "step": held_out.step}
        facts |= {key: value for key, value in self.trained.figures.items() if key in CARD_FIGURES}
        return CardFacts(
            name=registered_name(self.params),
            test_bits_per_byte=held_out.test_bits_per_byte,
            test_loss=held_out.test_loss,
            test_split=split_tags(self.tokens.test).get(TEST_SPLIT),
            dataset=describe(self.params.corpus),
            facts=facts,
        )


# The training figures a model card lists (their MLflow names), where the run recorded them.
CARD_FIGURES = (
    "parameter_count",
    "steps",
    "tokens_seen",
    "training_flops",
    "final_val_loss",
    "elapsed_seconds",
)


def export_checkpoint(
    checkpoint: Path,
    output: Path,
    tokenizer: Path | None = None,
    force: bool = False,
    facts: CardFacts | None = None,
) -> Path:
    """What the export stage and `gptpipe export` both do with a checkpoint: its model as a Hugging Face
    folder in `output` with `tokenizer` (default: the one the checkpoint names) and a model card of
    `facts` (default: what the checkpoint's record says); the folder."""
    from gptcore.checkpoint.load import load_model
    from gptcore.export.hf import export_hf
    from gptcore.export.model_files import checkpoint_tokenizer

    model, record = load_model(checkpoint)
    if facts is None:
        said = {"step": record.step, "val_loss": record.val_loss}
        facts = CardFacts(name=Path(output).name, facts={k: v for k, v in said.items() if v is not None})
    return export_hf(model, Path(tokenizer or checkpoint_tokenizer(record)), output, force=force, facts=facts)
