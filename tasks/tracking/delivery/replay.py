"""`gptpipe tracking replay`: an outbox's records sent to the store, in order, each landing once.

- **Nothing lost.** A record the store refuses (a 4xx: a deleted experiment, a read-only user) is kept:
  at the end the outbox holds the refused records and those not sent yet, and the report lists them
  (the command exits 1). Only a record that can never be sent by anyone (an artifact whose file is gone,
  a checkpoint that cannot be a model) is skipped, and said.
- **Nothing doubled.** Progress is written beside the outbox (`<outbox>.progress.json`, atomically)
  after every call the store took: the offset reached, the runs created (pending key -> id), the refused
  records. A replay killed midway resumes there. What a kill between a call and its progress may send
  twice lands once: MLflow keeps one of identical metrics, params, tags and inputs; a run is found by
  its record key (`gptpipe.record_key` tag) and a logged model by its checkpoint's sha256 before either
  is made again.
- **One at a time.** A replay holds the outbox's lock (`<outbox>.lock`), which the run writing the
  outbox holds too while it lives: a second replay is refused in one line.
- **Nothing it did not make.** A record that reads a local file (an artifact, a checkpoint as a model)
  is sent only when this user's gptpipe signed it (`tasks.tracking.delivery.signing`): a crafted outbox
  cannot upload an SSH key. Unsigned records of that kind are refused and kept.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptcore.errors import ConfigError
from gptcore.tools.atomic import write_json_atomic
from tasks.tracking.delivery.operations import (
    METRICS_PER_CALL,
    OPERATIONS,
    PENDING,
    NotAModel,
    is_outage,
    reason,
)
from tasks.tracking.delivery.outbox import Outbox
from tasks.tracking.delivery.queue import Item, same_call
from tasks.tracking.delivery.records import CreateRun, LogModel, Record, parse
from tasks.tracking.delivery.report import WriterReport
from tasks.tracking.delivery.signing import READS_FILES, sign, verified
from tasks.tracking.store import TrackingTarget, connect, redact

if TYPE_CHECKING:
    from mlflow import MlflowClient

RETRIES = 3
BACKOFF_SECONDS = 1.0


@dataclass(frozen=True)
class Refused:
    """A record the store (or its signature) refused, and why: kept in the outbox."""

    record: Record
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"record": self.record.line(), "reason": self.reason}


@dataclass
class Progress:
    """How far a replay of one outbox got; valid only for the outbox file it was written for."""

    path: Path
    generation: str
    size: int
    offset: int
    ids: dict[str, str] = field(default_factory=dict)  # pending key -> run id
    refused: list[Refused] = field(default_factory=list)

    @classmethod
    def of(cls, outbox: Outbox) -> Progress:
        path = outbox.path.with_name(outbox.path.name + ".progress.json")
        size = outbox.path.stat().st_size
        fresh = cls(path, outbox.generation, size, outbox.offset)
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return fresh
        if saved.get("generation") != outbox.generation or saved.get("size") != size:
            return fresh  # written for another version of the file: everything is sent again, once
        refused = [
            Refused(record, str(entry["reason"]))
            for entry in saved["refused"]
            if (record := parse(entry["record"])) is not None
        ]
        return cls(path, outbox.generation, size, int(saved["offset"]), dict(saved["ids"]), refused)

    def save(self) -> None:
        state = {"generation": self.generation, "size": self.size, "offset": self.offset}
        refused = [entry.to_dict() for entry in self.refused]
        write_json_atomic(self.path, {**state, "ids": self.ids, "refused": refused})


def replay_into(target: TrackingTarget, outbox: Outbox) -> WriterReport:
    """`gptpipe tracking replay`: the store checked (`store.connect`), every experiment the outbox makes
    runs in found live there (else a ConfigError, and nothing sent), then the outbox sent (`replay`)."""
    client = connect(target)
    _check_experiments(client, outbox, redact(target.uri))
    return replay(client, outbox)


def _check_experiments(client: MlflowClient, outbox: Outbox, shown: str) -> None:
    """Every experiment the outbox creates runs in must be live in the store: else nothing is sent."""
    wanted = {r.experiment_id for r in outbox.remaining() if isinstance(r, CreateRun | LogModel)}
    for experiment_id in sorted(wanted):
        try:
            experiment = client.get_experiment(experiment_id)
        except Exception:  # MLflow names a missing experiment in many kinds
            experiment = None
        if experiment is None or experiment.lifecycle_stage != "active":
            raise ConfigError(
                f"{outbox.path}: its runs belong to experiment {experiment_id}, which {shown} does not "
                "hold (deleted, or another store); nothing was sent"
            )


def replay(client: MlflowClient, outbox: Outbox) -> WriterReport:
    """Send the outbox's records (see the module); the report counts what was sent, skipped, refused
    (`given_up_calls`) and left (`waiting_records`, refused ones included)."""
    report = WriterReport(outbox=str(outbox.path))
    with outbox.locked():
        progress = Progress.of(outbox)
        outbox.offset = progress.offset
        stopped = False
        for group, end in _groups(outbox):
            outcome = _deliver(client, group, progress, report)
            if outcome == "away":
                stopped = True
                break
            progress.offset = end
            progress.save()
        _finish(outbox, progress, report, stopped)
    return report


def _groups(outbox: Outbox) -> Iterator[tuple[list[Record], int]]:
    """The waiting records from the outbox's offset, a call's worth at a time, each with where it ends."""
    while True:
        lines = outbox.read(METRICS_PER_CALL)
        if not lines:
            return
        size = len(same_call([Item(record=record) for record, _ in lines]))  # as the live writer groups
        yield [record for record, _ in lines[:size]], lines[size - 1][1]
        outbox.offset = lines[size - 1][1]


def _deliver(client: MlflowClient, group: list[Record], progress: Progress, report: WriterReport) -> str:
    """Send one group: `sent`, `skipped`, `refused` (kept) or `away` (the store did not answer)."""
    first = group[0]
    if not all(verified(record) or record.op not in READS_FILES for record in group):
        return _refuse(
            group,
            "not signed by this user's gptpipe, and it reads a local file: refused unread",
            progress,
            report,
        )
    for attempt in range(RETRIES):
        try:
            result = _send(client, group, progress)
        except (NotAModel, FileNotFoundError) as error:  # the record's file, not the store: never sendable
            report.count(skipped_records=len(group), last_error=f"{first.op}: {reason(error)}")
            return "skipped"
        except Exception as error:  # the store may fail in any way
            if not is_outage(error):
                return _refuse(group, reason(error), progress, report)
            report.count(failed_calls=1, last_error=f"{first.op}: {reason(error)}")
            if attempt + 1 == RETRIES:
                return "away"
            time.sleep(BACKOFF_SECONDS * 2**attempt)
            continue
        if isinstance(first, CreateRun):
            progress.ids[first.run] = result
        report.count(delivered_late=len(group), sent_metrics=len(group) if first.op == "metric" else 0)
        return "sent"
    return "away"


def _refuse(group: list[Record], problem: str, progress: Progress, report: WriterReport) -> str:
    """The store (or the signature) refused the group: kept, with why, for the outbox and the report."""
    progress.refused += [Refused(record, problem) for record in group]
    report.count(given_up_calls=1, last_error=f"{group[0].op}: {problem}")
    return "refused"


def _send(client: MlflowClient, group: list[Record], progress: Progress) -> Any:
    first = group[0]
    if isinstance(first, CreateRun):
        return OPERATIONS["create_run"](client, first.run, first)  # found by its key if made already
    run = progress.ids.get(first.run, first.run)
    if run.startswith(PENDING):
        raise ValueError(f"its run {first.run} was never created (the record creating it is not here)")
    if first.op == "metric":
        return OPERATIONS["metric"](client, run, group)
    if isinstance(first, LogModel):
        found = _logged_model_of(client, first, run)
        if found is not None:
            return found
    return OPERATIONS[first.op](client, run, first)


def _logged_model_of(client: MlflowClient, record: LogModel, run: str) -> str | None:
    """The logged model of this checkpoint and run, when an earlier replay made it already."""
    from gptcore.tools.fingerprint import sha256_file

    path = Path(record.path)
    if not path.is_file():
        return None
    digest = sha256_file(path)
    terms = f"tags.checkpoint_sha256 = '{digest}' and source_run_id = '{run}'"
    try:
        found = client.search_logged_models([record.experiment_id], filter_string=terms, max_results=1)
    except Exception:  # an older store that cannot search by these: log it again
        return None
    return found[0].model_id if found else None


def _finish(outbox: Outbox, progress: Progress, report: WriterReport, stopped: bool) -> None:
    """Leave in the outbox what the store refused and what was not sent, in order; remove it and the
    progress when nothing is left."""
    remaining = list(outbox.remaining()) if stopped else []
    kept = [entry.record for entry in progress.refused] + [_renamed(r, progress.ids) for r in remaining]
    report.waiting_records = outbox.rewrite(kept)
    report.store_down = stopped
    refused = [f"{entry.record.op} ({entry.reason})" for entry in progress.refused]
    if refused:
        report.last_error = f"the store refused {len(refused)}: {'; '.join(refused[:5])}"
    progress.path.unlink(missing_ok=True)


def _renamed(record: Record, ids: dict[str, str]) -> Record:
    """A record left waiting, its run's pending key replaced by the id this replay created; signed again
    only when it was this user's as it stood (a foreign record is never made to look like one's own)."""
    if isinstance(record, CreateRun) or record.run not in ids:
        return record
    renamed = record.model_copy(update={"run": ids[record.run]})
    return sign(renamed) if verified(record) else renamed
