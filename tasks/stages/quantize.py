"""The quantize stage: the evaluated checkpoint through each of `quantize.methods`, one row of a
size / quality / speed trade-off table per method beside fp32 (`gptcore.eval.quant_tradeoff`); cached on the
checkpoint's content hash, the test token file's, the settings and the code."""

from __future__ import annotations

import logging
from pathlib import Path

from gptcore.tools.fingerprint import code_version_of, fingerprint
from tasks.caching import stage_task
from tasks.params.schema import PipelineParams
from tasks.results import QuantizeResult, TokensResult, file_record
from tasks.stages.training import announce, run_directory

log = logging.getLogger(__name__)
# The figures of each measured method that the stage's summary shows (all of them are in the table).
HEADLINE = ("size_ratio", "test_perplexity_change", "greedy_agreement", "generate_tokens_per_second")


def quantize_fingerprint(params: PipelineParams, tokens: TokensResult, digest: str, device: str) -> str:
    import gptcore.eval.held_out
    import gptcore.eval.quant_tradeoff
    import gptcore.export.model_files
    import gptcore.generate
    import gptcore.model.gpt
    import gptcore.model.kv_cache
    import gptcore.model.quantization

    code = code_version_of(
        gptcore.model.quantization,
        gptcore.eval.quant_tradeoff,
        gptcore.export.model_files,
        gptcore.generate,
        gptcore.eval.held_out,
        gptcore.model.kv_cache,
        gptcore.model.gpt,
    )
    prompts = params.evaluate.model_dump(include={"prompts", "prompt_tokens"})
    return fingerprint(
        "quantize", digest, tokens.files.get(tokens.test), params.quantize.model_dump(), prompts, device, code
    )


@stage_task("quantize")
def quantize_task(
    fingerprint: str, params: PipelineParams, tokens: TokensResult, checkpoint: str, device: str
) -> QuantizeResult:
    """Each method's quantized model files and its row of the trade-off table, measured holding the
    device's slot (`tasks.device_slot`): generation speed beside a training is no figure."""
    from gptcore.checkpoint.load import load_model
    from gptcore.data.tokenfile import open_tokens
    from gptcore.eval.quant_tradeoff import measure_tradeoff, tradeoff_markdown, write_tradeoff
    from gptcore.export.model_files import model_files_in
    from gptcore.model.quantization import cpu_features
    from tasks.device_slot import device_slot

    folder = run_directory(params, "quantize", fingerprint)
    with device_slot(device, announce=announce):  # its speed columns are measured alone on the device
        model, _ = load_model(Path(checkpoint), device)
        rows = measure_tradeoff(
            model,
            list(params.quantize.methods),
            open_tokens(Path(tokens.test)),
            Path(tokens.tokenizer_path),
            params.quantize,
            params.evaluate,
            folder,
            device,
        )
    machine = cpu_features()
    written = write_tradeoff(rows, machine, folder)
    model_folders = {row.method: str(folder / row.method) for row in rows if row.measured}
    # The weights guard the cache (a hit whose weights are gone or changed runs again); the stage run
    # logs the .json and .md files of `files`, which are the tables alone this way.
    weights = [model_files_in(Path(place)).weights for place in model_folders.values()]
    _publish_table(rows, params.iteration)
    table = tradeoff_markdown(rows, machine)
    announce(f"quantize: the trade-off of {len(rows)} methods in {written[1]}\n{table}")
    figures: dict[str, object] = {}
    for row in rows:
        if not row.measured:
            figures[f"{row.method}/status"] = row.status
            continue
        figures.update({f"{row.method}/{name}": getattr(row, name) for name in HEADLINE})
    return QuantizeResult(
        fingerprint=fingerprint,
        checkpoint=checkpoint,
        rows=[row.to_dict() for row in rows],
        machine=machine,
        model_folders=model_folders,
        files=file_record(*written, *weights),
        outputs=[str(path) for path in written],
        figures=figures,
    )


def _publish_table(rows: list, iteration: int) -> None:
    """The table as a Prefect table artifact: a convenience, never a reason to fail the stage."""
    try:
        from prefect.artifacts import create_table_artifact

        create_table_artifact(
            [{key: value for key, value in row.to_dict().items() if value is not None} for row in rows],
            key=f"gptpipe-iteration-{iteration}-quantization",
            description="size, quality and speed of each quantization method beside fp32",
        )
    except Exception as error:
        log.warning("quantization table artifact not created: %s", error)
