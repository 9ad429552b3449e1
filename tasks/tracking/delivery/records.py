"""What a `RunWriter` queues and an outbox holds: one typed record per call into the store.

A record is one JSON line of an outbox (`tasks.tracking.delivery.outbox`): `op` (which call: a name of
`operations.OPERATIONS`), `run` (a run id, or the `pending-...` key of a run whose creation still waits),
the call's own fields under the names gptpipe has always written them, and `sig` once an outbox holds it
(`tasks.tracking.delivery.signing`). `line` is the record as that JSON object and `parse` reads one back:
an outbox written before the records were typed replays as it is, and a line that is no record of
gptpipe's is None, passed over as a torn line is.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic reads these on Python 3.11 only from here

from gptcore.tools.records import JSONObject


class OutboxRecord(BaseModel):
    """What every record holds: its run and, in an outbox, its signature."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: str  # which call (each kind below narrows it to its own name)
    run: str  # a run id, or the pending key of a run not created yet
    sig: str | None = None  # the user's HMAC of the rest, once an outbox holds it (signing.py)

    def line(self) -> JSONObject:
        """The record as its outbox line's JSON object: `op` first, `sig` last and only when signed."""
        data = self.model_dump(exclude={"sig"})
        line: JSONObject = {"op": data.pop("op"), **data}
        if self.sig is not None:
            line["sig"] = self.sig
        return line


R = TypeVar("R", bound=OutboxRecord)


class CreateRun(OutboxRecord):
    op: Literal["create_run"] = "create_run"
    experiment_id: str
    run_name: str
    tags: dict[str, str]  # redacted text; `gptpipe.record_key` the run's key (an older outbox's lack it)
    start_time: int  # Unix milliseconds, when the caller asked


class Metric(OutboxRecord):
    op: Literal["metric"] = "metric"
    key: str
    value: float
    timestamp: int  # Unix milliseconds, when the caller logged it (kept through an outage)
    step: int


class LogParams(OutboxRecord):
    op: Literal["log_params"] = "log_params"
    params: dict[str, str]  # redacted text within MLflow's length
    keep_existing: bool = False  # a resumed run: the params it has already are left alone


class SetTags(OutboxRecord):
    op: Literal["set_tags"] = "set_tags"
    tags: dict[str, str]  # redacted text within MLflow's length


class DatasetFields(TypedDict):
    """An `mlflow.entities.Dataset`'s constructor arguments."""

    name: str
    digest: str
    source_type: str
    source: str
    schema: str | None
    profile: str | None


class DatasetRecord(TypedDict):
    """An `mlflow.entities.DatasetInput`: its dataset and its input tags."""

    dataset: DatasetFields
    tags: dict[str, str]


class LogInputs(OutboxRecord):
    op: Literal["log_inputs"] = "log_inputs"
    datasets: list[DatasetRecord]


class LogArtifact(OutboxRecord):
    op: Literal["log_artifact"] = "log_artifact"
    path: str  # the local file, absolute: read when sent (a signed record only, on a replay)
    folder: str  # the artifact folder of the run


class LogDict(OutboxRecord):
    op: Literal["log_dict"] = "log_dict"
    data: JSONObject  # redacted
    file: str


class LogText(OutboxRecord):
    op: Literal["log_text"] = "log_text"
    text: str  # redacted
    file: str


class UpdateRun(OutboxRecord):
    op: Literal["update_run"] = "update_run"
    status: str


class SetTerminated(OutboxRecord):
    op: Literal["set_terminated"] = "set_terminated"
    status: str
    end_time: int  # Unix milliseconds, when the caller ended it


class LogModel(OutboxRecord):
    op: Literal["log_model"] = "log_model"
    experiment_id: str
    path: str  # the checkpoint, absolute: read when sent (a signed record only, on a replay)
    kind: str  # best or final
    tags: dict[str, str]


Record = Annotated[
    CreateRun
    | Metric
    | LogParams
    | SetTags
    | LogInputs
    | LogArtifact
    | LogDict
    | LogText
    | UpdateRun
    | SetTerminated
    | LogModel,
    Field(discriminator="op"),
]
_RECORD: TypeAdapter[Record] = TypeAdapter(Record)


def parse(line: object) -> Record | None:
    """The record an outbox line's JSON holds; None when it holds none of gptpipe's."""
    try:
        return _RECORD.validate_python(line)
    except ValidationError:
        return None
