"""Progress of a data stage for a person or a script: documents, bytes, tokens, tokens/s, time left.

On a terminal (and without `--json`) a live rich bar on stderr over the source's bytes; under `--json`
(`GPTPIPE_JSON=1`) a JSON line `{"event": "data_progress", ...}` on stdout every few seconds and at the
end; otherwise nothing. Time left is estimated from the bytes read so far against the source's size.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from gptcore.tools.console import json_line, json_only, wants_progress_bar

JSON_EVERY_SECONDS = 5.0


class DataProgress:
    def __init__(self, stage: str, total_bytes: int | None, done_bytes: int = 0) -> None:
        self.stage = stage
        self.total_bytes = total_bytes
        self.started = time.perf_counter()
        self.start_bytes = done_bytes
        self.figures: dict[str, int | float | None] = {
            "documents": 0,
            "source_bytes": done_bytes,
            "tokens": 0,
        }
        self.json = json_only()
        self.last_json = self.started
        self.bar: Any = None
        if wants_progress_bar():
            self._start_bar(done_bytes)

    def _start_bar(self, done_bytes: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TextColumn(
                "{task.fields[documents]} documents  {task.fields[tokens]} tokens  "
                "{task.fields[speed]} tokens/s"
            ),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self.task = self.bar.add_task(
            self.stage, total=self.total_bytes, completed=done_bytes, documents="0", tokens="0", speed="-"
        )
        self.bar.start()

    def update(self, documents: int, source_bytes: int, tokens: int, new_tokens: int) -> None:
        """Totals so far; `new_tokens` is what this run encoded (a resumed build's speed)."""
        seconds = time.perf_counter() - self.started
        speed = new_tokens / seconds if seconds > 0 else 0.0
        self.figures = {
            "documents": documents,
            "source_bytes": source_bytes,
            "tokens": tokens,
            "tokens_per_second": round(speed, 1),
            "seconds": round(seconds, 1),
            "seconds_left": self._left(source_bytes, seconds),
        }
        if self.bar is not None:
            self.bar.update(
                self.task,
                completed=source_bytes,
                documents=f"{documents:,}",
                tokens=f"{tokens:,}",
                speed=f"{speed:,.0f}",
            )
        if self.json and time.perf_counter() - self.last_json >= JSON_EVERY_SECONDS:
            self._emit()

    def _left(self, done: int, seconds: float) -> float | None:
        read = done - self.start_bytes
        if not self.total_bytes or read <= 0:
            return None
        return round(seconds * max(self.total_bytes - done, 0) / read, 1)

    def _emit(self) -> None:
        self.last_json = time.perf_counter()
        sys.stdout.write(json_line("data_progress", {"stage": self.stage, **self.figures}) + "\n")
        sys.stdout.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
        if self.json:
            self._emit()
