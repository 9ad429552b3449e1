"""The export stage: the evaluated checkpoint as a Hugging Face GPT-2 folder (`export.hf: true`),
cached on the checkpoint's content hash and the export code."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from gptcore.config import PipelineParams
from gptcore.fingerprint import code_version_of, fingerprint
from tasks.caching import fingerprint_key
from tasks.stage_results import ExportResult, TokensResult, file_record
from tasks.training_stages import announce, run_directory


def export_fingerprint(digest: str) -> str:
    import gptcore.hf_export
    import gptcore.model

    return fingerprint("export-hf", digest, code_version_of(gptcore.hf_export, gptcore.model))


@task(name="export", cache_key_fn=fingerprint_key("export"), persist_result=True)
def export_task(
    fingerprint: str, params: PipelineParams, tokens: TokensResult, checkpoint: str
) -> ExportResult:
    """Write the Hugging Face folder of `checkpoint` with the tokenizer its token files were made with."""
    from gptcore.generate import load_model
    from gptcore.hf_export import export_hf

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
