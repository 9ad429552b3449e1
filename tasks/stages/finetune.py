"""A fine-tune's base (`flows.finetune`), as its base stage resolves it and `gptpipe finetune` checks it.

`finetune.model` is resolved as any run's start model (`tasks.stages.start_model`: checked, kept, its
tokenizer the run's), and the adapters' targets and rank (QLoRA's kernels too) are checked on it before
anything trains; the base corpus's test split is found, for the before/after stage to measure forgetting.
"""

from __future__ import annotations

from pathlib import Path

from gptcore.data.tokenizer import TokenizerManifest
from gptcore.errors import ConfigError
from gptcore.model.config import ModelConfig
from tasks.params.schema import FinetuneConfig, PipelineParams
from tasks.stage import announce
from tasks.stages.corpus import data_root
from tasks.stages.start_model import BaseResult, CheckedStart, StartModel, check_start, resolve_start


def resolve_base(params: PipelineParams) -> BaseResult:
    """The base's files in place and checked (`check_base`), its architecture, the new corpus's tokenizer
    manifest over them (`tasks.stages.start_model`), the base corpus's test split found."""
    from gptcore.export.model_files import model_files_in

    base = resolve_start(params, _base_of(params))
    architecture = base.model.architecture
    check_methods(params, architecture)
    tokenizer = model_files_in(Path(base.folder)).tokenizer
    corpus = base.tokenizer.corpus_fingerprint
    own = base.lineage.get("base_test_split")
    found = _base_test_split(params, tokenizer, architecture.vocab_size, data_root(params), corpus, own)
    base = base.model_copy(update={"base_test_tokens": found})
    return ready_for_chat(params, base) if finetune_section(params).chat else base


def ready_for_chat(params: PipelineParams, base: BaseResult) -> BaseResult:
    """A chat fine-tune's base: the kept base's files with the chat template's tokens added to its
    tokenizer and rows for them grown in its embedding (`gptcore.finetune.vocabulary`), kept once beside
    it; what training starts from, and the "before" the fine-tune is measured against, prompted the same
    way."""
    from gptcore.export.model_files import model_files_in
    from gptcore.finetune.start import saved_architecture
    from gptcore.finetune.vocabulary import chat_model_files
    from gptcore.tools.atomic import publish_directory, staging_directory
    from gptcore.tools.fingerprint import sha256_file
    from tasks.results import file_record

    folder = Path(f"{base.folder}-chat")
    if not model_files_in(folder).weights.is_file():
        with staging_directory(folder) as staging:
            _, added = chat_model_files(model_files_in(Path(base.folder)), staging)
            publish_directory(staging, folder)
        announce(f"base: {added} chat tokens added to its tokenizer, its embedding grown to them in {folder}")
    kept = model_files_in(folder)
    architecture = saved_architecture(kept.weights)
    lineage = {**base.lineage, "base_weights_sha256": base.weights_sha256}  # the base's own, not the grown
    return base.model_copy(
        update={
            "folder": str(folder),
            "weights_sha256": sha256_file(kept.weights),
            "model": base.model.model_copy(update={"architecture": architecture}),
            "tokenizer": grown_tokenizer(base, kept.tokenizer),
            "lineage": lineage,
            "files": file_record(kept.weights, kept.config, kept.tokenizer),
            "outputs": [str(folder)],
        }
    )


def grown_tokenizer(base: BaseResult, tokenizer: Path) -> TokenizerManifest:
    """The base's tokenizer manifest (over the run's corpus, as the base stage made it) for its tokenizer
    grown to the chat tokens."""
    from dataclasses import replace

    from tokenizers import Tokenizer

    from gptcore.tools.fingerprint import sha256_file

    digest, size = sha256_file(tokenizer), Tokenizer.from_file(str(tokenizer)).get_vocab_size(True)
    return replace(base.tokenizer, fingerprint=f"base-{digest[:16]}", path=str(tokenizer), sha256=digest,
                   vocab_size=size, requested_vocab_size=size)  # fmt: skip


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
