"""JSON lines on a stream: the training callback the CLI installs (the trainer itself never prints), and
the way back from them into callbacks.

One object per line with an `event` key: `startup`, `step`, `eval`, `checkpoint`, `summary`, `failure`.
Scripts and tests read figures from these lines instead of scraping prose; a launching process reads
its ranks' lines back into its own callbacks with `JsonLinesReplay` (the channel of
`gptcore.train.multiprocess`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from gptcore.tools.console import json_line
from gptcore.tools.records import JSONObject
from gptcore.train.callbacks import CheckpointInfo, TrainingCallback
from gptcore.train.records import EvalRecord, StartupRecord, StepRecord, SummaryRecord


class JsonLinesCallback(TrainingCallback):
    """Every event as a JSON line, or only those in `events` (the summary alone, beside a progress bar)."""

    def __init__(self, stream: TextIO | None = None, events: tuple[str, ...] | None = None) -> None:
        self.stream = stream
        self.events = events

    def _emit(self, event: str, payload: JSONObject) -> None:
        if self.events is not None and event not in self.events:
            return
        stream = self.stream or sys.stdout
        stream.write(json_line(event, payload) + "\n")
        stream.flush()

    def on_start(self, startup: StartupRecord) -> None:
        self._emit(startup.event, startup.to_dict())

    def on_step(self, record: StepRecord) -> None:
        self._emit(record.event, record.to_dict())

    def on_eval(self, record: EvalRecord) -> None:
        self._emit(record.event, record.to_dict())

    def on_checkpoint(self, path: Path, info: CheckpointInfo) -> None:
        self._emit("checkpoint", {"path": str(path), **info})

    def on_end(self, summary: SummaryRecord) -> None:
        self._emit(summary.event, summary.to_dict())

    def on_failure(self, reason: str) -> None:
        self._emit("failure", {"reason": reason})


class JsonLinesReplay:
    """Feeds a launched training's JSON lines (rank 0's) to a callback as the records they were, as if
    in process; other lines go to `on_text`. `summary` holds the summary once it has come, `failure` the
    reason."""

    def __init__(self, callback: TrainingCallback, on_text: Callable[[str], None] | None = None) -> None:
        self.callback = callback
        self.on_text = on_text or (lambda line: None)
        self.startup: StartupRecord | None = None
        self.summary: SummaryRecord | None = None
        self.failure: str | None = None

    def __call__(self, line: str) -> None:
        record = _json_record(line)
        if record is None:
            self.on_text(line)
            return
        event = record.pop("event")
        if event == StartupRecord.event:
            self.startup = StartupRecord.from_dict(record)
            self.callback.on_start(self.startup)
        elif event == StepRecord.event:
            self.callback.on_step(StepRecord.from_dict(record))
        elif event == EvalRecord.event:
            self.callback.on_eval(EvalRecord.from_dict(record))
        elif event == "checkpoint":
            self.callback.on_checkpoint(Path(record.pop("path")), record)
        elif event == SummaryRecord.event:
            self.summary = SummaryRecord.from_dict(record)
            self.callback.on_end(self.summary)
        elif event == "failure":
            self.failure = str(record.get("reason"))
            self.callback.on_failure(self.failure)
        else:
            self.on_text(line)


def _json_record(line: str) -> JSONObject | None:
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("event"), str) else None
