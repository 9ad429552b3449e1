"""A model named by a URI: an MLflow model in the project's tracking store, or a Hugging Face GPT-2.

`models:/NAME@ALIAS`, `models:/NAME/VERSION` and `models:/MODEL_ID` are resolved here with a client on the
store (never MLflow's process-wide tracking URI) to the artifact location they name, `@champion` settled
first (`registry.settle_champion`); anything else (a local model folder, a `file://` URI) is loaded as it
is. `hf:<local folder or hub id>` is a `GPT2LMHeadModel` read into gptpipe's model files
(`gptcore.export.hf_import`): from the folder, or downloaded from the hub where it is reachable.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from gptcore.errors import GptpipeError, first_line
from tasks.tracking.models.registry import CHAMPION, settle_champion
from tasks.tracking.models.test_split import CORPUS, TEST_SPLIT
from tasks.tracking.store import TrackingTarget, connect, redact, resolve_target

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion
    from mlflow.pyfunc import PyFuncModel

    from gptcore.export.card import CardFacts
    from gptcore.export.model_files import ModelFiles
    from tasks.params.schema import TrackingConfig

EXPECTED = "models:/NAME@ALIAS, models:/NAME/VERSION, models:/MODEL_ID, hf:FOLDER_OR_HUB_ID or a model folder"
HF = "hf:"


class ModelNotFound(GptpipeError):
    exit_code = 1


def registered_version(client: MlflowClient, uri: str) -> ModelVersion | None:
    """The registry's version a `models:/NAME@ALIAS` or `models:/NAME/VERSION` URI names; None for any
    other URI (a logged model's id, a folder)."""
    if not uri.startswith("models:/"):
        return None
    name = uri.removeprefix("models:/").strip("/")
    if "@" in name:
        model, alias = name.split("@", 1)
        if alias == CHAMPION:
            settle_for_reading(client, model)
        return client.get_model_version_by_alias(model, alias)
    if "/" in name:
        return client.get_model_version(*name.split("/", 1))
    return None


def settle_for_reading(client: MlflowClient, name: str) -> None:
    """`@champion` settled before it is read (`registry.settle_champion`): a racer killed right after a
    stale set is put right by whoever reads next. One who may only read leaves it to one who may write."""
    from mlflow.exceptions import MlflowException

    try:
        settle_champion(client, name)
    except MlflowException as error:
        if error.error_code != "PERMISSION_DENIED":
            raise


def recorded_split(uri: str, config: TrackingConfig | None = None) -> dict[str, str]:
    """The test split tags (`test_split.split_tags`) of the model `uri` names in the store: a registered
    version's, else a logged model's (`models:/ID`); empty for a folder, `hf:`, or a model registered
    before gptpipe tagged splits."""
    if not uri.startswith("models:/"):
        return {}  # a folder or hf: names no split: no store to ask
    client = connect(resolve_target(config))
    version = registered_version(client, uri)
    if version is not None:
        tags = version.tags
    else:
        tags = client.get_logged_model(uri.removeprefix("models:/").strip("/")).tags or {}
    return {key: tags[key] for key in (TEST_SPLIT, CORPUS) if tags.get(key)}


def card_facts_of(uri: str, config: TrackingConfig | None = None) -> CardFacts:
    """A model card's facts from what the registry says of the version `uri` names (its test figure
    and split, its base); for any other URI, its name alone."""
    from gptcore.export.card import CardFacts

    name = uri.removeprefix("models:/").split("@")[0].split("/")[0] if uri.startswith("models:/") else uri
    if not uri.startswith("models:/"):
        return CardFacts(name=Path(uri).name or uri)
    version = registered_version(connect(resolve_target(config)), uri)
    tags = version.tags if version is not None else {}
    bits = tags.get("test_bits_per_byte")
    facts = {"version": version.version} if version is not None else {}
    facts |= {key: tags[key] for key in ("finetune.method", "quantization") if tags.get(key)}
    return CardFacts(
        name=name,
        test_bits_per_byte=float(bits) if bits else None,
        test_split=tags.get(TEST_SPLIT),
        base_model=tags.get("base_model_uri"),
        facts=facts,
    )


def artifact_location(client: MlflowClient, uri: str) -> str:
    """Where the model a `models:/` URI names is stored (other URIs are returned as they are)."""
    if not uri.startswith("models:/"):
        return uri
    version = registered_version(client, uri)
    if version is not None:
        return client.get_model_version_download_uri(version.name, str(version.version))
    return client.get_logged_model(uri.removeprefix("models:/").strip("/")).artifact_location


def _not_found(uri: str, target: TrackingTarget, error: BaseException) -> ModelNotFound:
    reason = first_line(error)
    return ModelNotFound(
        f"--model {uri}: cannot be loaded from {redact(target.uri)} ({reason[:300]}); expected {EXPECTED}"
    )


def locate(uri: str, config: TrackingConfig | None = None) -> tuple[str, TrackingTarget]:
    """The artifact location `uri` names in the store, and the store's target; an unreachable store is a
    TrackingError, a model, alias or version that is not there a one-line ModelNotFound."""
    target = resolve_target(config)
    client = connect(target)
    try:
        return artifact_location(client, uri), target
    except Exception as error:  # MLflow names a missing model, alias or version in many kinds
        raise _not_found(uri, target, error) from None


def load_model_uri(uri: str, config: TrackingConfig | None = None) -> PyFuncModel:
    """The pyfunc model at `uri`; a one-line ModelNotFound naming the URI when it cannot be loaded."""
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    location, target = locate(uri, config)
    try:
        return mlflow.pyfunc.load_model(location)
    except (MlflowException, OSError, ValueError) as error:
        raise _not_found(uri, target, error) from None


def model_files_of(uri: str, config: TrackingConfig | None = None, into: Path | None = None) -> ModelFiles:
    """The files (`gptcore.export.model_files.ModelFiles`) of the logged model `uri` names, downloaded
    (into the folder `into`, else a new temporary one)."""
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException

    from gptcore.export.model_files import model_files_in

    if uri.startswith(HF):
        return hf_model_files(
            uri, Path(into) if into is not None else Path(tempfile.mkdtemp(prefix="gptpipe-hf-"))
        )
    if Path(uri).is_dir():  # a folder here (model files, or an MLflow model's): its files as they are
        from gptcore.export.model_files import model_files_at

        return _gptpipe_files(model_files_at(Path(uri)), uri)
    location, target = locate(uri, config)
    try:
        where = str(into) if into is not None else None
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=location, dst_path=where)) / "artifacts"
    except (MlflowException, OSError, ValueError) as error:
        raise _not_found(uri, target, error) from None
    return _gptpipe_files(model_files_in(local), uri)


def _gptpipe_files(files: ModelFiles, uri: str) -> ModelFiles:
    if files.missing():
        named = ", ".join(files.missing())
        raise ModelNotFound(f"--model {uri}: not a gptpipe model (no {named} among its artifacts)")
    return files


def hf_model_files(uri: str, into: Path) -> ModelFiles:
    """`hf:<folder or hub id>` as gptpipe's model files in `into` (its weights fp32, its own tokenizer)."""
    from gptcore.export.hf_import import read_hf_gpt2
    from gptcore.export.model_files import write_model_files

    source = uri.removeprefix(HF)
    folder = Path(source).expanduser()
    if not folder.is_dir():
        folder = _hub_folder(source, uri, into / "hub")
    imported = read_hf_gpt2(folder, into / "tokenizer")
    return write_model_files(imported.model, imported.tokenizer, into / "model")


# What a GPT-2 folder needs from the hub: nothing else is downloaded.
HUB_FILES = ["config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "vocab.json",
             "merges.txt", "special_tokens_map.json", "tokenizer_config.json"]  # fmt: skip


def _hub_folder(repository: str, uri: str, into: Path) -> Path:
    """The hub's copy of `repository`, or one line naming the local-folder way when it is not reachable."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repository, allow_patterns=HUB_FILES, local_dir=into))
    except Exception as error:  # offline, unknown repository, no access: the hub says it many ways
        raise ModelNotFound(
            f"--model {uri}: not a folder here, and the Hugging Face hub did not give it "
            f"({first_line(error)[:200]}); download it where the hub is reachable "
            f"(huggingface-cli download {repository}) and pass hf:/path/to/that/folder"
        ) from None


def base_model(
    uri: str, config: TrackingConfig | None, into: Path, key: str = "finetune.model"
) -> tuple[ModelFiles, dict[str, str]]:
    """The model files a run starts from (a registered or logged model's, downloaded into the folder
    `into`; `hf:`; or a local model-files folder's) and its lineage: the URI and, for a registered one,
    its name, version, logged model, run and test split, as the trained versions' tags name them.
    Errors name `key`, the parameter file's key that gave the URI (`--model` sets finetune.model too)."""
    from gptcore.export.model_files import model_files_in

    lineage = {"base_model_uri": uri}
    if not uri.startswith(("models:/", HF)):
        if not (Path(uri) / "model_config.json").is_file():
            raise ModelNotFound(f"{key} {uri}: no model there; expected {EXPECTED}")
        return model_files_in(Path(uri)), lineage
    try:
        files = hf_model_files(uri, into) if uri.startswith(HF) else model_files_of(uri, config, into)
    except ModelNotFound as error:
        raise ModelNotFound(str(error).replace("--model", key, 1)) from None
    if uri.startswith(HF):
        return files, lineage
    version = registered_version(connect(resolve_target(config)), uri)
    if version is not None:
        lineage.update(
            base_registered_model=version.name,
            base_model_version=str(version.version),
            base_model_id=getattr(version, "model_id", None) or "",
            base_run_id=version.run_id or "",
            **({"base_test_split": version.tags[TEST_SPLIT]} if version.tags.get(TEST_SPLIT) else {}),
        )
    return files, lineage
