"""A fine-tune's own stages (`flows.finetune`): its base model, and what the fine-tune learned and forgot.

The base stage resolves `finetune.model` as any run's start model (`tasks.stages.start_model`: checked,
kept, its tokenizer the run's), and checks the adapters' targets and rank (QLoRA's kernels too) before
anything trains. The before/after stage measures the base and the fine-tuned model on the new corpus's test
split and on the base corpus's, with the evaluate stage's settings: what was learned, what was forgotten.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gptcore.errors import ConfigError
from gptcore.model.config import ModelConfig
from gptcore.tools.atomic import write_json_atomic
from gptcore.tools.fingerprint import code_version_of, fingerprint, sha256_file
from tasks.caching import stage_task
from tasks.params.schema import FinetuneConfig, PipelineParams
from tasks.results import BaseResult, BeforeAfterResult, FullResult, MergeResult, TokensResult, file_record
from tasks.stages.start_model import CheckedStart, StartModel, check_start, resolve_start
from tasks.stages.training import announce, run_directory

BEFORE_AFTER_FILE = "before_after.json"


def resolve_base(params: PipelineParams) -> BaseResult:
    """The base's files in place and checked (`check_base`), its architecture, the new corpus's tokenizer
    manifest over them (`tasks.stages.start_model`), the base corpus's test split found."""
    from gptcore.export.model_files import model_files_in

    base = resolve_start(params, _base_of(params))
    architecture = base.model.architecture
    check_methods(params, architecture)
    data_root = Path(params.paths.data_root).resolve()
    tokenizer = model_files_in(Path(base.folder)).tokenizer
    corpus = base.tokenizer["corpus_fingerprint"]
    own = base.lineage.get("base_test_split")
    found = _base_test_split(params, tokenizer, architecture.vocab_size, data_root, corpus, own)
    return base.model_copy(update={"base_test_tokens": found})


def check_base(params: PipelineParams, scratch: Path, source: str = "the parameter file") -> CheckedStart:
    """The base's files (downloaded into `scratch`), lineage and architecture, when they fit the
    parameter file `source` (`start_model.check_start`) and the methods can train on it (`check_methods`);
    a one-line error naming the key otherwise. Nothing is kept: `gptpipe finetune` calls this before
    anything starts."""
    found = check_start(params, _base_of(params), scratch, source)
    check_methods(params, found.model.architecture)
    return found


def check_methods(params: PipelineParams, architecture: ModelConfig) -> None:
    """The adapters' targets and rank on the base's architecture; QLoRA's kernels on the device."""
    from gptcore.finetune.lora import check_adapters

    tune = finetune_section(params)
    if {"lora", "qlora"} & set(tune.methods()):
        check_adapters(architecture, tune.lora)
    if "qlora" in tune.methods():
        check_quantized_base(params)


def _base_of(params: PipelineParams) -> StartModel:
    return StartModel(finetune_section(params).model, "finetune.model")


def check_quantized_base(params: PipelineParams) -> None:
    """QLoRA's quantized base, refused in one line where torchao or the run's device cannot hold it."""
    from gptcore.finetune.config import QLoRAConfig
    from gptcore.finetune.qlora import check_available
    from gptcore.runtime.device import resolve_device

    settings = QLoRAConfig(**finetune_section(params).lora.model_dump())
    check_available(settings, resolve_device(params.runtime.device))


def finetune_section(params: PipelineParams, source: str = "the parameter file") -> FinetuneConfig:
    """The `finetune` section (`tasks.params.schema.FinetuneConfig`); a ConfigError naming `source` when the
    file has none (a pretraining file)."""
    if params.finetune is None:
        raise ConfigError(f"{source}: finetune: missing section: name the base model to fine-tune there")
    return params.finetune


def _base_test_split(
    params: PipelineParams, tokenizer: Path, vocab_size: int, data_root: Path, corpus: str, own: str | None
) -> str | None:
    """`finetune.base_test_tokens`, checked to be a test split made with the base's tokenizer; unset, the
    base's own split (`own`, the fingerprint its registered version names) under the data root, else the
    newest split made with its tokenizer of another corpus, said so (None: forgetting goes unmeasured)."""
    from gptcore.data.tokenfile import check_tokenizer, find_split, find_test_tokens, open_tokens
    from gptcore.errors import DataError

    given = params.finetune.base_test_tokens if params.finetune else None
    if given is None:
        found = find_split(data_root, own) if own else None
        if found is None:
            found = find_test_tokens(tokenizer, data_root, other_than_corpus=corpus)
            if found is not None:
                why = f"its own test split {own} is not under {data_root}/tokens" if own else "it names none"
                announce(f"base: forgetting measured on {found}, the newest split of its tokenizer ({why})")
        return str(found) if found else None
    try:
        stream = open_tokens(given)
        check_tokenizer(tokenizer, vocab_size, (stream,))
    except DataError as error:
        raise ConfigError(f"finetune.base_test_tokens {given}: {error}") from None
    if stream.manifest is None or stream.manifest.split != "test":
        raise ConfigError(f"finetune.base_test_tokens {given}: not a test split's token file (test.bin)")
    return given


def merge_fingerprint(params: PipelineParams, full: FullResult) -> str:
    import gptcore.checkpoint.merge
    import gptcore.finetune.lora
    import gptcore.finetune.qlora

    tune = finetune_section(params)
    code = code_version_of(gptcore.checkpoint.merge, gptcore.finetune.lora, gptcore.finetune.qlora)
    return fingerprint("merge", full.files, tune.method, params.evaluate.checkpoint, code)


@stage_task("merge")
def merge_task(fingerprint: str, params: PipelineParams, full: FullResult) -> MergeResult:
    """The fine-tune's checkpoints as plain models: a (Q)LoRA run's final and best merged into
    `<run>/merged`, and the evaluated one's adapters alone in `<run>/adapter`; a full fine-tune's
    checkpoints as they are (it trained the weights themselves)."""
    from gptcore.checkpoint.files import damage
    from gptcore.checkpoint.load import whole_checkpoint
    from gptcore.checkpoint.merge import ADAPTER_CONFIG, MERGED, merge_checkpoint, write_adapter

    directory = Path(full.run_directory)
    # by the rule every reader follows: the evaluated one whole (else what it falls back to), and final
    # and best where they are whole, so a kill mid-write never fails this stage for good
    evaluated, passed_over = whole_checkpoint(directory, params.evaluate.checkpoint)
    if passed_over:
        announce(f"merge: {'; '.join(passed_over)}; taking {evaluated.name} instead")
    named = [directory / f"{name}.pt" for name in ("final", "best")]
    trained = list(
        dict.fromkeys([*(path for path in named if path.is_file() and damage(path) is None), evaluated])
    )
    if finetune_section(params).adapters() is None:
        plain = [str(path) for path in trained]
        announce("merge: full fine-tuning trained the weights themselves; nothing to merge")
        return MergeResult(
            fingerprint=fingerprint, run_directory=str(directory), merged=False, checkpoints=plain,
            files=file_record(*plain), outputs=plain, figures={"merged_checkpoints": 0},
        )  # fmt: skip
    merged = [merge_checkpoint(path, directory / MERGED) for path in trained]
    adapter = write_adapter(evaluated, directory / "adapter")
    outputs = [*merged, adapter, adapter.with_name(ADAPTER_CONFIG)]
    announce(f"merge: {len(merged)} checkpoint(s) merged into {directory / MERGED}; adapters in {adapter}")
    return MergeResult(
        fingerprint=fingerprint, run_directory=str(directory / MERGED), merged=True,
        checkpoints=[str(path) for path in merged], adapter=str(adapter), files=file_record(*outputs),
        outputs=[str(path) for path in outputs], figures={"merged_checkpoints": len(merged)},
    )  # fmt: skip


def before_after_fingerprint(
    params: PipelineParams, base: BaseResult, tokens: TokensResult, digest: str, device: str
) -> str:
    import gptcore.eval.held_out

    base_test = sha256_file(base.base_test_tokens) if base.base_test_tokens else None
    return fingerprint(
        "before-after",
        base.weights_sha256,
        digest,
        tokens.files.get(tokens.test),
        base_test,
        params.evaluate.model_dump(),
        device,
        code_version_of(gptcore.eval.held_out),
    )


@stage_task("before-after")
def before_after_task(
    fingerprint: str, params: PipelineParams, tokens: TokensResult, checkpoint: str, device: str,
    base: BaseResult,
) -> BeforeAfterResult:  # fmt: skip
    """Bits per byte of the base (before) and of the fine-tuned model (after) on the new corpus's test
    split (`new_test_*`) and the base corpus's (`base_test_*`), holding the device's slot."""
    from gptcore.checkpoint.load import load_model
    from gptcore.data.tokenfile import open_tokens
    from gptcore.eval.held_out import stream_figures
    from gptcore.export.model_files import model_files_in, read_model_files
    from tasks.device_slot import device_slot

    kept = model_files_in(Path(base.folder))
    splits = {"new": tokens.test, "base": base.base_test_tokens}
    figures: dict[str, Any] = {}
    with device_slot(device, announce=announce):
        before = read_model_files(kept.weights, kept.config, device)
        models = {"before": before, "after": load_model(Path(checkpoint), device)[0]}
        for split, path in splits.items():
            if path is None:
                continue
            stream = open_tokens(path)
            for when, model in models.items():
                loss, bits, predicted = stream_figures(model, stream, params.evaluate)
                figures[f"{split}_test_loss_{when}"] = loss
                figures[f"{split}_test_bits_per_byte_{when}"] = bits
            figures[f"{split}_test_tokens"] = predicted
    folder = run_directory(params, "before-after", fingerprint)
    folder.mkdir(parents=True, exist_ok=True)
    record = write_json_atomic(folder / BEFORE_AFTER_FILE, {"splits": splits, "figures": figures})
    announce(before_after_line(figures))
    return BeforeAfterResult(
        fingerprint=fingerprint, files=file_record(record), outputs=[str(record)], figures=figures
    )


def before_after_line(figures: dict[str, Any]) -> str:
    def change(split: str) -> str:
        before, after = (figures.get(f"{split}_test_bits_per_byte_{when}") for when in ("before", "after"))
        if before is None or after is None:
            return "not measured (no base test split under the data root)"
        return f"{before:.4f} -> {after:.4f} bits/byte"

    return f"before-after: new corpus {change('new')}; base corpus {change('base')}"
