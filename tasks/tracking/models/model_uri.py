"""A model named by an MLflow model URI, loaded from the project's tracking store.

`models:/NAME@ALIAS`, `models:/NAME/VERSION` and `models:/MODEL_ID` are resolved here with a client on the
store (never MLflow's process-wide tracking URI) to the artifact location they name; anything else (a local
model folder, a `file://` URI) is loaded as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gptcore.errors import GptpipeError, first_line
from tasks.tracking.store import connect, redact, resolve_target

EXPECTED = "models:/NAME@ALIAS, models:/NAME/VERSION, models:/MODEL_ID or a model folder"


class ModelNotFound(GptpipeError):
    exit_code = 1


def registered_version(client: Any, uri: str) -> Any:
    """The registry's version a `models:/NAME@ALIAS` or `models:/NAME/VERSION` URI names; None for any
    other URI (a logged model's id, a folder)."""
    if not uri.startswith("models:/"):
        return None
    name = uri.removeprefix("models:/").strip("/")
    if "@" in name:
        return client.get_model_version_by_alias(*name.split("@", 1))
    if "/" in name:
        return client.get_model_version(*name.split("/", 1))
    return None


def artifact_location(client: Any, uri: str) -> str:
    """Where the model a `models:/` URI names is stored (other URIs are returned as they are)."""
    if not uri.startswith("models:/"):
        return uri
    version = registered_version(client, uri)
    if version is not None:
        return client.get_model_version_download_uri(version.name, str(version.version))
    return client.get_logged_model(uri.removeprefix("models:/").strip("/")).artifact_location


def _not_found(uri: str, target: Any, error: BaseException) -> ModelNotFound:
    reason = first_line(error)
    return ModelNotFound(
        f"--model {uri}: cannot be loaded from {redact(target.uri)} ({reason[:300]}); expected {EXPECTED}"
    )


def locate(uri: str, config: Any = None) -> tuple[str, Any]:
    """The artifact location `uri` names in the store, and the store's target; an unreachable store is a
    TrackingError, a model, alias or version that is not there a one-line ModelNotFound."""
    target = resolve_target(config)
    client = connect(target)
    try:
        return artifact_location(client, uri), target
    except Exception as error:  # MLflow names a missing model, alias or version in many kinds
        raise _not_found(uri, target, error) from None


def load_model_uri(uri: str, config: Any = None) -> Any:
    """The pyfunc model at `uri`; a one-line ModelNotFound naming the URI when it cannot be loaded."""
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    location, target = locate(uri, config)
    try:
        return mlflow.pyfunc.load_model(location)
    except (MlflowException, OSError, ValueError) as error:
        raise _not_found(uri, target, error) from None


def model_files_of(uri: str, config: Any = None) -> Any:
    """The files (`gptcore.export.model_files.ModelFiles`) of the logged model `uri` names, downloaded."""
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException

    from gptcore.export.model_files import model_files_in

    location, target = locate(uri, config)
    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=location)) / "artifacts"
    except (MlflowException, OSError, ValueError) as error:
        raise _not_found(uri, target, error) from None
    files = model_files_in(local)
    missing = [path.name for path in (files.weights, files.config, files.tokenizer) if not path.is_file()]
    if missing:
        raise ModelNotFound(
            f"--model {uri}: not a gptpipe model (no {', '.join(missing)} among its artifacts)"
        )
    return files
