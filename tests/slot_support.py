"""A device's slot held by a process of the test's own, so a test decides when others may have it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Holds the slot until a line (or the end) arrives on its standard input: the test says when.
HOLD_UNTIL = """
import json, sys, time
from tasks.device_slot import device_slot
say = lambda **line: print(json.dumps(line), flush=True)
with device_slot(sys.argv[1], announce=lambda line: say(said=line)):
    say(holding=time.time())
    sys.stdin.readline()
    say(released=time.time())
"""
CEILING = 120  # against a hang only: a slot is taken in about a second


class Holder:
    """A process holding `device`'s slot until `release()`, its JSON lines read as they come."""

    def __init__(self, device: str, env: dict[str, str], prefix: list[str] = ()) -> None:
        command = [*prefix, sys.executable, "-c", HOLD_UNTIL, device]
        self.process = subprocess.Popen(
            command, env=env, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.lines: list[dict] = []

    def release(self) -> None:
        """Let the slot go once held (at once, if it already holds it)."""
        self.process.stdin.close()

    def next_line(self) -> dict:
        line = self.process.stdout.readline()  # the test's timeout ends a hang
        assert line, f"the holder exited ({self.process.wait()}) before saying more: {self.lines}"
        self.lines.append(json.loads(line))
        return self.lines[-1]

    def until(self, key: str) -> dict:
        while key not in (line := self.next_line()):
            pass
        return line

    def said(self) -> list[str]:
        return [line["said"] for line in self.lines if "said" in line]


@contextmanager
def holding_the_device(device: str, env: dict[str, str]) -> Iterator[None]:
    """The slot of `device` held by a process of the test's until the block ends: who else asks for it
    waits, and says so, for as long as the test wants."""
    holder = Holder(device, env)
    try:
        holder.until("holding")
        yield
    finally:
        holder.release()
        assert holder.process.wait(timeout=CEILING) == 0
