"""What a command prints for people and for scripts: whether a person is watching (a live bar), or JSON
lines alone were asked for (`--json`, or `GPTPIPE_JSON=1`), and one JSON line of an event."""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

from gptcore.tools.records import JSONObject

JSON_ONLY = "GPTPIPE_JSON"  # set (to anything but 0) for JSON lines only, also on a terminal


def json_only() -> bool:
    return os.environ.get(JSON_ONLY, "0") not in ("", "0")


def wants_progress_bar() -> bool:
    """A person is watching: stdout is a terminal and JSON lines alone were not asked for."""
    return sys.stdout.isatty() and not json_only()


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null (strict parsers reject them otherwise)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


def json_line(event: str, payload: JSONObject) -> str:
    return json.dumps(
        _clean({"event": event, **{k: v for k, v in payload.items() if k != "event"}}), default=str
    )
