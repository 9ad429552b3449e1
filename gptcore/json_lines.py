"""JSON lines on a stream: the training callback the CLI installs (the trainer itself never prints).

One object per line with an `event` key: `startup`, `step`, `eval`, `checkpoint`, `summary`, `failure`.
Scripts and tests read figures from these lines instead of scraping prose.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, TextIO

from gptcore.callbacks import TrainingCallback


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null (strict parsers reject them otherwise)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


def json_line(event: str, payload: dict[str, Any]) -> str:
    return json.dumps(
        _clean({"event": event, **{k: v for k, v in payload.items() if k != "event"}}), default=str
    )


class JsonLinesCallback(TrainingCallback):
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    def _emit(self, event: str, payload: dict[str, Any]) -> None:
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
