"""The export stage: the evaluated checkpoint as a Hugging Face folder (`export.hf: true`): GPT-2's
layout, or Llama's / Qwen3's for the modern recipe; cached on the checkpoint's content hash and the
export code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
        folder = export_checkpoint(self.read.checkpoint, into, Path(self.tokens.tokenizer_path), force=True)
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


def export_checkpoint(
    checkpoint: Path, output: Path, tokenizer: Path | None = None, force: bool = False
) -> Path:
    """What the export stage and `gptpipe export` both do with a checkpoint: its model as a Hugging Face
    folder in `output` with `tokenizer` (default: the one the checkpoint names); the folder."""
    from gptcore.checkpoint.load import load_model
    from gptcore.export.hf import export_hf
    from gptcore.export.model_files import checkpoint_tokenizer

    model, record = load_model(checkpoint)
    return export_hf(model, Path(tokenizer or checkpoint_tokenizer(record)), output, force=force)
