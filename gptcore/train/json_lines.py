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
from typing import Any, TextIO

from gptcore.tools.console import json_line
from gptcore.train.callbacks import TrainingCallback


class JsonLinesCallback(TrainingCallback):
    """Every event as a JSON line, or only those in `events` (the summary alone, beside a progress bar)."""

    def __init__(self, stream: TextIO | None = None, events: tuple[str, ...] | None = None) -> None:
        self.stream = stream
        self.events = events

    def _emit(self, event: str, payload: dict[str, Any]) -> None:
        if self.events is not None and event not in self.events:
            return
        stream = self.stream or sys.stdout
        stream.write(json_line(event, payload) + "\n")
        stream.flush()

    def on_start(self, startup: dict[str, Any]) -> None:
        self._emit("startup", startup)

    def on_step(self, metrics: dict[str, Any]) -> None:
        self._emit("step", metrics)

    def on_eval(self, metrics: dict[str, Any]) -> None:
        self._emit("eval", metrics)

    def on_checkpoint(self, path: Path, info: dict[str, Any]) -> None:
        self._emit("checkpoint", {"path": str(path), **info})

    def on_end(self, summary: dict[str, Any]) -> None:
        self._emit("summary", summary)

    def on_failure(self, reason: str) -> None:
        self._emit("failure", {"reason": reason})


class JsonLinesReplay:
    """Feeds a launched training's JSON lines (rank 0's) to a callback, as if in process; other
    lines go to `on_text`. `summary` holds the summary line once it has come, `failure` the reason."""

    def __init__(self, callback: TrainingCallback, on_text: Callable[[str], None] | None = None) -> None:
        self.callback = callback
        self.on_text = on_text or (lambda line: None)
        self.startup: dict[str, Any] | None = None
        self.summary: dict[str, Any] | None = None
        self.failure: str | None = None

    def __call__(self, line: str) -> None:
        record = _json_record(line)
        if record is None:
            self.on_text(line)
            return
        event = record.pop("event")
        if event == "startup":
            self.startup = {"event": event, **record}
            self.callback.on_start(self.startup)
        elif event == "step":
            self.callback.on_step(record)
        elif event == "eval":
            self.callback.on_eval(record)
        elif event == "checkpoint":
            self.callback.on_checkpoint(Path(record.pop("path")), record)
        elif event == "summary":
            self.summary = {"event": event, **record}
            self.callback.on_end(self.summary)
        elif event == "failure":
            self.failure = str(record.get("reason"))
            self.callback.on_failure(self.failure)
        else:
            self.on_text(line)


def _json_record(line: str) -> dict[str, Any] | None:
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("event"), str) else None
