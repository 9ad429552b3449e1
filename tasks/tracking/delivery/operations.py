"""What a `RunWriter` sends to the store: each record's call (`OPERATIONS`).

A record (`tasks.tracking.delivery.records`) is typed by its `op` and holds the operation's own JSON
fields. Keeping them JSON is what lets the records of an outage be spilled to disk, read back, and
replayed by another process (`gptpipe tracking replay`) exactly as the training would have sent them:
same steps, same timestamps, same order. Each operation is one function `(client, run_id, record) ->
result`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptcore.errors import GptpipeError, first_line
from tasks.tracking.delivery.records import (
    CreateRun,
    DatasetRecord,
    LogArtifact,
    LogDict,
    LogInputs,
    LogModel,
    LogParams,
    LogText,
    Metric,
    OutboxRecord,
    SetTags,
    SetTerminated,
    UpdateRun,
)
from tasks.tracking.store import redact

if TYPE_CHECKING:
    from mlflow.entities import DatasetInput

PARAM_VALUE_LIMIT = 6000  # MLflow's limits on one value and on one log_batch call
TAG_VALUE_LIMIT = 8000
PARAMS_PER_CALL = 100
METRICS_PER_CALL = 1000
PENDING = "pending-"  # the prefix of a run key whose run is not created yet
RECORD_KEY = "gptpipe.record_key"  # a created run's tag: the key its records named it by (found again by it)


def text(value: object, limit: int) -> str:
    """A param or tag value as MLflow stores it: redacted text within its length limit."""
    return redact(value)[:limit]


# --- records: built on the caller's thread, from its arguments ------------------------------------------


def metric(run: str, key: str, value: float, timestamp_ms: int, step: int) -> Metric:
    return Metric(run=run, key=key, value=float(value), timestamp=timestamp_ms, step=step)


def dataset_inputs(datasets: Sequence[DatasetInput]) -> list[DatasetRecord]:
    """`mlflow.entities.DatasetInput`s as records' JSON (`log_inputs` rebuilds them)."""
    return [
        {
            "dataset": {
                "name": item.dataset.name,
                "digest": item.dataset.digest,
                "source_type": item.dataset.source_type,
                "source": item.dataset.source,
                "schema": item.dataset.schema,
                "profile": item.dataset.profile,
            },
            "tags": {tag.key: tag.value for tag in item.tags},
        }
        for item in datasets
    ]


# --- operations: run on the writer's thread -----------------------------------------------------------------


def _create_run(client: Any, key: str, record: CreateRun) -> str:
    """The run the record creates, made once: a create the store carried out but whose answer was lost
    (a timeout, a server stopped before it replied) is found by its key when it is sent again, live or
    from the outbox, instead of making a second run."""
    found = client.search_runs([record.experiment_id], f"tags.`{RECORD_KEY}` = '{key}'", max_results=1)
    if found:
        return found[0].info.run_id
    tags = {**record.tags, RECORD_KEY: key}  # an outbox record written before the writer tagged it lacks it
    run = client.create_run(
        record.experiment_id, start_time=record.start_time, tags=tags, run_name=record.run_name
    )
    return run.info.run_id


def _metrics(client: Any, run_id: str, records: list[Metric]) -> None:
    from mlflow.entities import Metric as Sent

    batch = [Sent(r.key, r.value, r.timestamp, r.step) for r in records]
    client.log_batch(run_id, metrics=batch)


def _params(client: Any, run_id: str, record: LogParams) -> None:
    """With `keep_existing` (a resumed run) the params the run already has are left alone: MLflow
    refuses to change one."""
    from mlflow.entities import Param

    existing = client.get_run(run_id).data.params if record.keep_existing else {}
    fresh = [Param(k, v) for k, v in record.params.items() if k not in existing]
    for start in range(0, len(fresh), PARAMS_PER_CALL):
        client.log_batch(run_id, params=fresh[start : start + PARAMS_PER_CALL])


def _tags(client: Any, run_id: str, record: SetTags) -> None:
    from mlflow.entities import RunTag

    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in record.tags.items()])


def _inputs(client: Any, run_id: str, record: LogInputs) -> None:
    from mlflow.entities import Dataset, DatasetInput, InputTag

    datasets = [
        DatasetInput(Dataset(**item["dataset"]), [InputTag(k, v) for k, v in item["tags"].items()])
        for item in record.datasets
    ]
    client.log_inputs(run_id, datasets=datasets)


def _artifact(client: Any, run_id: str, record: LogArtifact) -> None:
    if not Path(record.path).is_file():  # removed since (a rotated checkpoint): nothing to send
        raise FileNotFoundError(f"{record.path}: no longer exists")
    client.log_artifact(run_id, record.path, record.folder)


def _dict(client: Any, run_id: str, record: LogDict) -> None:
    client.log_dict(run_id, record.data, record.file)


def _text(client: Any, run_id: str, record: LogText) -> None:
    client.log_text(run_id, record.text, record.file)


def _update(client: Any, run_id: str, record: UpdateRun) -> None:
    client.update_run(run_id, status=record.status)


def _terminated(client: Any, run_id: str, record: SetTerminated) -> None:
    client.set_terminated(run_id, record.status, end_time=record.end_time)


def _model(client: Any, run_id: str, record: LogModel) -> str | None:
    """The checkpoint as a logged model of the run; a checkpoint that cannot be one is a `NotAModel`."""
    from tasks.tracking.models.logged_models import log_checkpoint_model

    try:
        return log_checkpoint_model(
            client, record.experiment_id, run_id, Path(record.path), record.kind, record.tags
        )
    except (GptpipeError, OSError, KeyError) as error:  # the checkpoint, not the store
        raise NotAModel(f"logged model {record.kind}: {first_line(error)}") from None


class NotSendable(Exception):
    """A record that can never be sent (its run was never created): given up."""


class NotAModel(NotSendable):
    """A checkpoint that cannot be a logged model (no tokenizer recorded, unreadable): noted only, as
    the checkpoint's business, not the store's."""


OPERATIONS: dict[str, Callable[[Any, str, Any], Any]] = {
    "create_run": _create_run,
    "metric": _metrics,  # given a list: consecutive metrics of one run go in one log_batch
    "log_params": _params,
    "set_tags": _tags,
    "log_inputs": _inputs,
    "log_artifact": _artifact,
    "log_dict": _dict,
    "log_text": _text,
    "update_run": _update,
    "set_terminated": _terminated,
    "log_model": _model,
}


def is_outage(error: BaseException) -> bool:
    """Whether `error` says the store is away (worth waiting for) rather than that it refused the call.

    MLflow reports a refused connection, a timeout or a 5xx as an `MlflowException` of HTTP status 500+
    (`INTERNAL_ERROR`, `TEMPORARILY_UNAVAILABLE`); a bad request is a 4xx and is given up."""
    from mlflow.exceptions import MlflowException

    if isinstance(error, NotSendable | FileNotFoundError):
        return False
    if isinstance(error, MlflowException):
        return error.get_http_status_code() >= 500
    try:
        import requests

        if isinstance(error, requests.HTTPError):
            return error.response is None or error.response.status_code >= 500
        if isinstance(error, requests.ConnectionError | requests.Timeout):
            return True
    except ImportError:
        pass
    return isinstance(error, ConnectionError | TimeoutError)


_REQUEST = re.compile(r"API request to (\S+) failed")
_CAUSE = re.compile(r"\[Errno -?\d+\] [^'\")]+|Read timed out|timed out")


def reason(error: BaseException) -> str:
    """`error` in one short line: MLflow's HTTP failures become `URL: [Errno 111] Connection refused`
    instead of a pool's whole repr."""
    line = first_line(error)
    request, cause = _REQUEST.search(line), _CAUSE.search(line)
    if request and cause:
        return f"{request.group(1)}: {cause.group(0).strip()}"
    return line[:500]


def dumps(record: OutboxRecord) -> str:
    """The record as its outbox line (no newline)."""
    return json.dumps(record.line(), default=str, allow_nan=True)
