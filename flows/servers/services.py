"""Long-running services started together and stopped together: a database, then the servers on it.

`run_services` starts groups of services one after another (a group's services together), waits until
each answers its readiness check and has run its `prepare` step (create the databases, say), tells the
caller, then watches. The first of: Ctrl-C, SIGTERM, or a service exiting on its own, stops every
service in reverse order of start, each with its whole process tree, so a server stops before the
database under it. Each service also dies with this process however it dies (`kill -9` leaves no
handler): Linux sends it `death_signal` when its parent goes.

Each service starts in the working folder it names (one nobody else writes: uvicorn imports from the
folder it runs in whatever Python is told), with PYTHONSAFEPATH set, so no Python it starts, however deep
(MLflow's server starts `python -m uvicorn` itself), puts that folder on its import path on its own.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gptcore.errors import ConfigError
from gptcore.tools.processes import ProcessTree, StopRequested, on_parent_death, start_group, stop_requests


@dataclass
class Service:
    """One service: its command, how to tell it is ready, and what to do once it is."""

    name: str
    command: list[str]
    ready: Callable[[], bool]  # polled until True: the service answers
    cwd: str  # where it runs: a folder nobody else writes
    env: dict[str, str] | None = None
    user: str | None = None  # run as this user (PostgreSQL refuses to run as root)
    prepare: Callable[[], None] | None = None  # once ready, before the next group starts
    death_signal: int = signal.SIGTERM  # what it gets when this process dies
    tree: ProcessTree | None = field(default=None, init=False)
    pump: threading.Thread | None = field(default=None, init=False)  # reads its output until EOF

    def start(self, lines: queue.Queue) -> None:
        death_signal = self.death_signal
        env = {**(os.environ if self.env is None else self.env), "PYTHONSAFEPATH": "1"}  # inherited down
        process = start_group(  # a group of its own: stopped as a whole, in our order
            self.command,
            env,
            self.cwd,
            user=self.user,
            preexec_fn=lambda: on_parent_death(death_signal),  # in the child, its user set, before exec
        )
        self.tree = ProcessTree(process)
        self.pump = threading.Thread(target=_pump, args=(self.name, process, lines), daemon=True)
        self.pump.start()

    def exited(self) -> int | None:
        return None if self.tree is None else self.tree.process.poll()


PUMP_SECONDS = 5.0  # a stopped service's pipe reaches EOF at once; a grandchild holding it open, not


def _pump(name: str, process: subprocess.Popen, lines: queue.Queue) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put((name, line.rstrip("\n")))


def run_services(
    groups: Sequence[Sequence[Service]],
    on_line: Callable[[str, str], None],
    on_ready: Callable[[], None],
    startup_timeout: float = 120.0,
    grace_seconds: float = 20.0,
) -> None:
    """Start `groups` in order, call `on_ready`, and run until stopped (see the module's docstring).

    Returns after a stop request has stopped everything (the signal is then delivered again to its
    previous handler, as `run_process_tree` does); a service that exits on its own, or is not ready
    within `startup_timeout`, stops the others and raises ConfigError naming it."""
    lines: queue.Queue = queue.Queue()
    started: list[Service] = []
    with stop_requests() as requests:
        try:
            for group in groups:
                for service in group:
                    service.start(lines)
                    started.append(service)
                _wait_ready(group, started, lines, on_line, requests, startup_timeout)
            on_ready()
            while True:
                _drain(lines, on_line, requests, started, timeout=0.2)
        except BaseException:
            _stop_all(started, grace_seconds, requests)
            for service in started:  # the last words of each service, shutdown included: read to EOF
                if service.pump is not None:
                    service.pump.join(timeout=PUMP_SECONDS)
            while not lines.empty():
                on_line(*lines.get_nowait())
            raise


def _drain(
    lines: queue.Queue,
    on_line: Callable[[str, str], None],
    requests: list[int],
    started: Sequence[Service],
    timeout: float,
) -> None:
    """Hand over the output that came, then check for a stop request or a service gone."""
    with contextlib.suppress(queue.Empty):
        on_line(*lines.get(timeout=timeout))
        while True:
            on_line(*lines.get_nowait())
    if requests:
        raise StopRequested
    for service in started:
        code = service.exited()
        if code is not None:
            time.sleep(0.2)  # its last lines are still in the pipe
            raise ConfigError(f"{service.name} exited with status {code}; every other service was stopped")


def _wait_ready(
    group: Sequence[Service],
    started: Sequence[Service],
    lines: queue.Queue,
    on_line: Callable[[str, str], None],
    requests: list[int],
    startup_timeout: float,
) -> None:
    deadline = time.monotonic() + startup_timeout
    waiting = list(group)
    while waiting:
        _drain(lines, on_line, requests, started, timeout=0.2)
        for service in list(waiting):
            if service.ready():
                if service.prepare is not None:
                    service.prepare()
                waiting.remove(service)
        if waiting and time.monotonic() > deadline:
            names = ", ".join(service.name for service in waiting)
            raise ConfigError(f"{names} did not answer within {startup_timeout:.0f} s; every service stopped")


def _stop_all(started: Sequence[Service], grace_seconds: float, requests: list[int]) -> None:
    for service in reversed(started):  # the servers first, the database under them last
        if service.tree is not None:
            service.tree.stop(grace_seconds, hurry=lambda: len(requests) > 1)
