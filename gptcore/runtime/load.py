"""How busy the machine was while a speed was measured: a figure is only a figure when nothing else shared
the device, so each speed is recorded with these two beside it.

- `load_average`: the kernel's 1-minute load average (tasks running or waiting for a core, this run's own
  threads included), the mean of its values sampled over the measurement. It lags by design: over a
  short measurement it mostly shows what came before.
- `other_cpu_cores`: the CPU time every other process spent during the measurement, per second of it
  (from the machine's busy time less this process tree's own; under torchrun the tree is the launcher's,
  so a training's other ranks are its own): 0 when the run had the CPU to itself, 1.0 when something
  else kept one core busy throughout. Exact to the kernel's tick for short measurements too.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from dataclasses import dataclass, field

import psutil

from gptcore.distributed.torchrun import under_torchrun


def _busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (guest time is already in user time)."""
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    guests = getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    return sum(times) - idle - guests


class _Tree:
    """This run's processes: itself (or its torchrun launcher) and every descendant, whose CPU seconds
    (the reaped ones' through their parent's children times) are the run's own. The descendants are
    looked up again every `refresh` seconds: a walk of the process table costs milliseconds, and a log
    interval can be shorter."""

    def __init__(self, refresh: float = 10.0) -> None:
        me = psutil.Process()
        self.root = me.parent() if under_torchrun() and me.parent() is not None else me
        self.refresh = refresh
        self.members: list[psutil.Process] = []
        self.looked = -math.inf

    def seconds(self) -> float:
        if time.monotonic() - self.looked > self.refresh:
            with contextlib.suppress(psutil.Error):
                self.members = self.root.children(recursive=True)
            self.looked = time.monotonic()
        total = 0.0
        for process in (self.root, *self.members):
            with contextlib.suppress(psutil.Error):
                user, system, children_user, children_system = process.cpu_times()[:4]
                total += user + system + children_user + children_system
        return total


@dataclass
class _Mark:
    """Where a measurement started."""

    tree: _Tree
    wall: float = field(default_factory=time.monotonic)
    busy: float = field(default_factory=_busy_seconds)
    own: float = 0.0
    loads: list[float] = field(default_factory=lambda: [os.getloadavg()[0]])

    def __post_init__(self) -> None:
        self.own = self.tree.seconds()

    def figures(self) -> dict[str, float]:
        wall = time.monotonic() - self.wall
        self.loads.append(os.getloadavg()[0])
        other = ((_busy_seconds() - self.busy) - (self.tree.seconds() - self.own)) / wall if wall > 0 else 0.0
        return {"load_average": statistics.fmean(self.loads), "other_cpu_cores": max(other, 0.0)}


class MachineLoad:
    """The machine's load over a whole measurement and over its intervals (a training's log lines)."""

    def __init__(self) -> None:
        self._tree = _Tree()
        self._whole = _Mark(self._tree)
        self._interval = _Mark(self._tree)

    def interval(self) -> dict[str, float]:
        """The figures since the last interval (or the start), and a new interval begins."""
        figures = self._interval.figures()
        self._whole.loads.append(self._interval.loads[-1])
        self._interval = _Mark(self._tree)
        return figures

    def whole(self) -> dict[str, float]:
        """The figures since the start."""
        return self._whole.figures()
