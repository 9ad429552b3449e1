"""A model named by an MLflow model URI (`models:/gptpipe-iteration-1@champion`, `models:/<model_id>`,
`runs:/<run_id>/...`, or a local model folder), loaded from the project's tracking store."""

from __future__ import annotations

from typing import Any

from gptcore.errors import GptpipeError
from tasks.tracking.store import connect, redact, resolve_target


class ModelNotFound(GptpipeError):
    exit_code = 1


def load_model_uri(uri: str, config: Any = None) -> Any:
    """The pyfunc model at `uri`; a one-line ModelNotFound naming the URI when it cannot be loaded.

    Sets MLflow's process-wide tracking URI (models:/ URIs resolve there): for command-line use."""
    import mlflow
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    target = resolve_target(config)
    connect(target)  # an unreachable store is a TrackingError, not a model that is missing
    mlflow.set_tracking_uri(target.uri)
    try:
        return mlflow.pyfunc.load_model(uri)
    except (MlflowException, OSError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelNotFound(
            f"--model {uri}: cannot be loaded from {redact(target.uri)} ({reason[:300]}); expected "
            "models:/NAME@ALIAS, models:/NAME/VERSION, models:/MODEL_ID or a model folder"
        ) from None

