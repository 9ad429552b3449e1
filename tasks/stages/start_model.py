"""The model a run starts from: a fine-tune's base (`finetune.model`) or a continued pretraining's
`full.init_from`. Either is a model URI (registered, logged, `hf:<hub id or folder>`, a model-files
folder), resolved and checked before anything trains (fp32 weights, a tokenizer within its vocabulary
that knows the end-of-text token), kept once under `<data_root>/base-models/<weights sha256>`, and its
architecture and tokenizer made the run's: training builds the model its files say (a `model` section in
the parameter file is checked against it), and the corpus is encoded with the model's own vocabulary,
never a new one. Resolved every time (an alias may have moved); copied once.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptcore.data.tokenizer import TokenizerManifest
from gptcore.errors import ConfigError
from gptcore.model.config import ModelConfig
from gptcore.tools.atomic import publish_directory, staging_directory
from gptcore.tools.fingerprint import sha256_file
from tasks.params.jobs import TrainingStart
from tasks.params.schema import ModelProfile, PipelineParams
from tasks.results import Record, StageResult, file_record
from tasks.stages.corpus import corpus_for, data_root
from tasks.stages.tokenizer import CorpusSummary, TokenizerResult

BASE_MODELS = "base-models"  # under paths.data_root


class BaseResult(StageResult):
    uri: str  # finetune.model or full.init_from as given
    lineage: dict[str, str]  # base_model_uri, base_registered_model, base_model_version, ...
    folder: str  # the model's files, kept under <data_root>/base-models
    weights_sha256: str
    model: ModelProfile  # what training builds: the model's own architecture (`start_profile`)
    tokenizer: Record[TokenizerManifest]  # the model's tokenizer over the run's corpus
    base_test_tokens: str | None = None  # a fine-tune's base corpus's test split (None: not found)

    def start(self) -> TrainingStart:
        """Where training starts: this model's architecture and its kept files."""
        return TrainingStart(self.model, Path(self.folder))

    def tokenizer_result(self) -> TokenizerResult:
        """The model's tokenizer as the tokens stage takes a trained one."""
        manifest = self.tokenizer
        return TokenizerResult(
            fingerprint=manifest.fingerprint,
            tokenizer=manifest,
            corpus=CorpusSummary(fingerprint=manifest.corpus_fingerprint),
            files={manifest.path: manifest.sha256},
            outputs=[manifest.path],
        )

    def lineage_tags(self) -> dict[str, str]:
        """What a version trained from this model says of it in its tags: the model (URI, registered
        name and version or source) and its weights' sha256 (the base's own, for a chat fine-tune's base
        grown to the chat tokens)."""
        return {"base_weights_sha256": self.weights_sha256, **self.lineage}


@dataclass(frozen=True)
class StartModel:
    uri: str  # as the parameter file (or --model) gives it
    key: str  # the key that names it, for errors: finetune.model or full.init_from


@dataclass(frozen=True)
class CheckedStart:
    """A start model's files as `check_start` found them, and the model a run from it builds."""

    files: Any  # gptcore.export.model_files.ModelFiles, in the caller's scratch folder
    lineage: dict[str, str]
    model: ModelProfile  # the start model's own architecture (`start_profile`)


def start_model(params: PipelineParams) -> StartModel | None:
    """The model the parameter file's training starts from (None: random initial weights)."""
    key = params.start_model_key()
    if key is None:
        return None
    return StartModel(params.finetune.model if params.finetune else str(params.full.init_from), key)


def check_start(
    params: PipelineParams, start: StartModel, scratch: Path, source: str = "the parameter file"
) -> CheckedStart:
    """The model's files (downloaded into `scratch`), lineage and architecture, when a run can start
    from them: fp32 weights, an architecture the parameter file (`source`) does not contradict, a tokenizer
    within its vocabulary that knows the end-of-text token; a one-line error naming `start.key` otherwise.
    Nothing is kept."""
    import tokenizers

    from gptcore.data.tokenfile import check_tokenizer
    from gptcore.finetune.start import saved_architecture
    from tasks.tracking.models.model_uri import base_model

    files, lineage = base_model(start.uri, params.tracking, scratch, start.key)
    if files.quantization is not None:
        raise ConfigError(
            f"{start.key} {start.uri}: a {files.method} model; start from an fp32 one (@champion)"
        )
    model = start_profile(params, saved_architecture(files.weights), start, source)
    check_tokenizer(files.tokenizer, model.architecture.vocab_size)
    end_of_text = params.tokenizer.end_of_text
    if tokenizers.Tokenizer.from_file(str(files.tokenizer)).token_to_id(end_of_text) is None:
        raise ConfigError(f"{start.key}: the model's tokenizer has no end-of-text token {end_of_text!r}")
    return CheckedStart(files, lineage, model)


def start_profile(
    params: PipelineParams, saved: ModelConfig | None, start: StartModel, source: str
) -> ModelProfile:
    """The model a run from `start` builds: its own architecture, `saved` beside its weights. A `model`
    section in the parameter file (`source`) must be that architecture (its dropout, a training setting,
    is the run's); a file naming none takes the profile of that architecture (`loading.profile_of`)."""
    from tasks.params.loading import profile_of

    if saved is None:  # model files always carry it: a folder made by hand may not
        raise ConfigError(f"{start.key} {start.uri}: no model_config.json beside its weights")
    if params.model is None:
        return profile_of(saved)
    differs = params.model.architecture.differences(saved)
    if differs:
        ours = ", ".join(f"{key} {mine}" for key, (mine, _) in differs.items())
        theirs = ", ".join(f"{key} {value}" for key, (_, value) in differs.items())
        raise ConfigError(
            f"{source}: model.architecture: {ours} is not the architecture of {start.key} {start.uri} "
            f"({theirs}); remove the model section to train the model's own"
        )
    return params.model


def resolve_start(params: PipelineParams, start: StartModel) -> BaseResult:
    """The model's files in place and checked (`check_start`), its architecture, and its tokenizer's
    manifest over the parameter file's corpus, as the tokens stage takes a trained tokenizer's."""
    from gptcore.export.model_files import model_files_in

    root = data_root(params)
    with tempfile.TemporaryDirectory(prefix="gptpipe-base-") as scratch:
        checked = check_start(params, start, Path(scratch))
        files = checked.files
        folder = _kept_copy(files, root / BASE_MODELS / sha256_file(files.weights)[:16])
    kept = model_files_in(folder)
    return BaseResult(
        fingerprint=None,  # never cached: a model URI may name another version tomorrow
        uri=start.uri,
        lineage=checked.lineage,
        folder=str(folder),
        weights_sha256=sha256_file(kept.weights),
        model=checked.model,
        tokenizer=_tokenizer_manifest(params, kept.tokenizer, root),
        files=file_record(kept.weights, kept.config, kept.tokenizer),
        outputs=[str(folder)],
        figures={"base_model_uri": start.uri, **checked.lineage},
    )


def _kept_copy(files: Any, folder: Path) -> Path:
    """The model's weights, architecture and tokenizer copied to `folder` (once: named by the weights)."""
    if (folder / files.weights.name).is_file():
        return folder
    with staging_directory(folder) as staging:
        for path in (files.weights, files.config, files.tokenizer):
            shutil.copyfile(path, staging / path.name)
        publish_directory(staging, folder)
    return folder


def _tokenizer_manifest(params: PipelineParams, tokenizer: Path, root: Path) -> TokenizerManifest:
    """The model's tokenizer as the tokens stage takes one: a tokenizer manifest over the corpus."""
    import tokenizers

    loaded = tokenizers.Tokenizer.from_file(str(tokenizer))  # checked by `check_start`
    size, end_of_text = loaded.get_vocab_size(with_added_tokens=True), params.tokenizer.end_of_text
    corpus = corpus_for(params.corpus, root, fresh=True).fingerprint
    digest = sha256_file(tokenizer)
    return TokenizerManifest(
        fingerprint=f"base-{digest[:16]}",
        corpus_fingerprint=corpus,  # the text encoded: this corpus, with the model's vocabulary
        path=str(tokenizer),
        sha256=digest,
        vocab_size=size,
        requested_vocab_size=size,
        min_frequency=0,
        end_of_text=end_of_text,
        end_of_text_id=loaded.token_to_id(end_of_text),
        seconds=0.0,
        tokenizers_version=tokenizers.__version__,
        code_version="base-model",
    )
