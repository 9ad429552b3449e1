"""A model named by an MLflow model URI, loaded from the project's tracking store.

`models:/NAME@ALIAS`, `models:/NAME/VERSION` and `models:/MODEL_ID` are resolved here with a client on the
store (never MLflow's process-wide tracking URI) to the artifact location they name; anything else (a local
model folder, a `file://` URI) is loaded as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gptcore.errors import GptpipeError
from tasks.tracking.store import connect, redact, resolve_target

EXPECTED = "models:/NAME@ALIAS, models:/NAME/VERSION, models:/MODEL_ID or a model folder"


class ModelNotFound(GptpipeError):
    exit_code = 1


def artifact_location(client: Any, uri: str) -> str:
    """Where the model a `models:/` URI names is stored (other URIs are returned as they are)."""
    if not uri.startswith("models:/"):
        return uri
    name = uri.removeprefix("models:/").strip("/")
    if "@" in name:
        registered, alias = name.split("@", 1)
        version = client.get_model_version_by_alias(registered, alias).version
        return client.get_model_version_download_uri(registered, str(version))
    if "/" in name:
        registered, version = name.split("/", 1)
        return client.get_model_version_download_uri(registered, version)
    return client.get_logged_model(name).artifact_location


def load_model_uri(uri: str, config: Any = None) -> Any:
    """The pyfunc model at `uri`; a one-line ModelNotFound naming the URI when it cannot be loaded."""
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    target = resolve_target(config)
    client = connect(target)  # an unreachable store is a TrackingError, not a missing model
    try:
        return mlflow.pyfunc.load_model(artifact_location(client, uri))
    except (MlflowException, OSError, ValueError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelNotFound(
            f"--model {uri}: cannot be loaded from {redact(target.uri)} ({reason[:300]}); expected {EXPECTED}"
        ) from None


def model_files_of(uri: str, config: Any = None) -> Any:
    """The files (`gptcore.model_files.ModelFiles`) of the logged model `uri` names, downloaded."""
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException

    from gptcore.model_files import CONFIG, TOKENIZER, WEIGHTS, ModelFiles

    target = resolve_target(config)
    client = connect(target)
    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=artifact_location(client, uri)))
    except (MlflowException, OSError, ValueError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelNotFound(
            f"--model {uri}: cannot be loaded from {redact(target.uri)} ({reason[:300]}); expected {EXPECTED}"
        ) from None
    files = ModelFiles(
        local / "artifacts" / WEIGHTS, local / "artifacts" / CONFIG, local / "artifacts" / TOKENIZER
    )
    missing = [
        str(path.name) for path in (files.weights, files.config, files.tokenizer) if not path.is_file()
    ]
    if missing:
        raise ModelNotFound(
            f"--model {uri}: not a gptpipe model (no {', '.join(missing)} among its artifacts)"
        )
    return files
