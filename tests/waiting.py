"""Waiting on a condition, never on a guessed while: a test acts once what it needs has happened."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(condition: Callable[[], T], what: str, ceiling: float = 120, every: float = 0.05) -> T:
    """`condition()`'s first true value, asked every `every` seconds; the ceiling only ends a hang, so a
    slow or busy machine waits longer and still passes."""
    deadline = time.monotonic() + ceiling
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what}: not so after {ceiling} s"
        time.sleep(every)
    return value


def answers(url: str) -> bool:
    """Whether `url` answers 200 now (a server still starting refuses or times out)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False
