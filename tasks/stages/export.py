"""The export stage: the evaluated checkpoint as a Hugging Face folder (`export.hf: true`): GPT-2's
layout, or Llama's / Qwen3's for the modern recipe; cached on the checkpoint's content hash and the
export code."""

from __future__ import annotations

from pathlib import Path

from gptcore.tools.fingerprint import code_version_of, fingerprint
from tasks.caching import stage_task
from tasks.params.schema import PipelineParams
from tasks.results import ExportResult, TokensResult, file_record
from tasks.stages.training import announce, run_directory


def export_fingerprint(digest: str) -> str:
    import gptcore.export.hf
    import gptcore.export.hf_llama
    import gptcore.model.gpt

    code = code_version_of(gptcore.export.hf, gptcore.export.hf_llama, gptcore.model.gpt)  # both layouts
    return fingerprint("export-hf", digest, code)


@stage_task("export")
def export_task(
    fingerprint: str, params: PipelineParams, tokens: TokensResult, checkpoint: str
) -> ExportResult:
    """Write the Hugging Face folder of `checkpoint` with the tokenizer its token files were made with."""
    from gptcore.checkpoint.load import load_model
    from gptcore.export.hf import export_hf

    model, _ = load_model(Path(checkpoint))
    folder = export_hf(
        model, Path(tokens.tokenizer_path), run_directory(params, "export-hf", fingerprint), force=True
    )
    files = sorted(path for path in folder.iterdir() if path.is_file())
    announce(f"export: a Hugging Face folder in {folder}")
    return ExportResult(
        fingerprint=fingerprint,
        folder=str(folder),
        checkpoint=checkpoint,
        files=file_record(*files),
        outputs=[str(folder)],
        figures={"format": "hf", "files": len(files)},
    )
