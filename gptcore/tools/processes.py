"""Process trees: running a command with every process it starts, and stopping all of them.

`run_process_tree` runs a command (torchrun and its ranks, an MLflow or Prefect server), hands each
output line to `on_line` as it comes, returns the exit code, and on cancellation (an event, SIGTERM,
Ctrl-C, an error in `on_line`) stops the whole tree: torchrun starts each rank in a session of its own,
and a server's workers outlive a signal to their parent alone, so the group and every descendant found
are stopped. `die_with_parent` is the other side: a child that goes when its launcher does.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

import psutil

from gptcore.errors import TrainingError

LAUNCHER_PID_VARIABLE = "GPTPIPE_LAUNCHER_PID"


class LaunchCancelled(TrainingError):
    """The launched training was stopped from outside (flow-run cancellation, SIGTERM, Ctrl-C)."""

    exit_code = 130


def process_alive(pid: int) -> bool:
    """Whether a process of that id exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


class StopRequested(BaseException):
    """SIGINT or SIGTERM arrived while watching: unwinds the watch loop so the tree is stopped first."""


def _pump(stream: IO[str], lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _running(member: psutil.Process) -> bool:
    try:
        return member.is_running() and member.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class ProcessTree:
    """A process started with `start_new_session=True` and everything it starts: its process group (a
    child started a moment ago is reached by `killpg` before anyone has seen it) and every descendant
    seen on the way (torchrun starts each rank in a session of its own, outside the group: only its
    parent finds it). A zombie counts as stopped: it holds nothing, and only its parent can reap it."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.members: dict[int, psutil.Process] = {}

    def look(self) -> list[psutil.Process]:
        """Add the processes of the group and the descendants of the root and of every member (one pass
        over the process table); return the ones not seen before."""
        children: dict[int, list[psutil.Process]] = {}
        found: dict[int, psutil.Process] = {}
        for candidate in psutil.process_iter(["ppid"]):
            children.setdefault(candidate.info["ppid"], []).append(candidate)
            with contextlib.suppress(OSError):
                if os.getpgid(candidate.pid) == self.process.pid:
                    found[candidate.pid] = candidate
        parents = [self.process.pid, *self.members]
        while parents:
            for child in children.get(parents.pop(), []):
                if child.pid not in found:
                    found[child.pid] = child
                    parents.append(child.pid)
        new = [member for pid, member in found.items() if pid not in self.members and pid != self.process.pid]
        self.members.update((member.pid, member) for member in new)
        return new

    def signal(self, signum: int, members: Sequence[psutil.Process] | None = None) -> None:
        """`signum` to the group and to each member outside it (each process gets it once: a second
        SIGTERM means "hurry" to some servers)."""
        if members is None:
            members = list(self.members.values())
            with contextlib.suppress(OSError):
                os.killpg(self.process.pid, signum)
        for member in members:
            with contextlib.suppress(OSError, psutil.Error):
                if os.getpgid(member.pid) != self.process.pid:
                    member.send_signal(signum)

    def running(self) -> list[int]:
        """The PIDs still running: the root (reaped here, so it never lingers as a zombie) and members."""
        left = [] if self.process.poll() is not None else [self.process.pid]
        return left + [pid for pid, member in self.members.items() if _running(member)]

    def stop(self, grace_seconds: float = 10.0, hurry: Callable[[], bool] = lambda: False) -> list[int]:
        """SIGTERM to everything, and to each child that appears meanwhile. What still runs after
        `grace_seconds`, or as soon as `hurry()` (a second Ctrl-C), is killed. Returns the PIDs killed."""
        self.look()
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        while self.running() and time.monotonic() < deadline and not hurry():
            time.sleep(0.05)
            self.signal(signal.SIGTERM, self.look())
        killed = self.running()
        deadline = time.monotonic() + 10  # SIGKILL cannot be refused: this wait is brief
        while killed and self.running() and time.monotonic() < deadline:
            self.look()
            self.signal(signal.SIGKILL)
            time.sleep(0.05)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        return killed


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_requests() -> Iterator[list[int]]:
    """While a tree runs (watched from the main thread), SIGINT and SIGTERM are recorded, never raised
    where they land: a signal that arrives while the child starts, or while the tree is being stopped,
    cannot leave a process behind. Afterwards the previous handlers are back and the first signal is
    delivered again, so whoever handles it (Prefect's engine, Python's KeyboardInterrupt, the default
    exit) still sees it. A signal that was ignored stays ignored."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {
        signum: signal.signal(signum, lambda signum, frame: received.append(signum))
        for signum in STOP_SIGNALS
        if signal.getsignal(signum) is not signal.SIG_IGN
    }
    try:
        yield received
    except StopRequested:
        pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if received:
            signal.raise_signal(received[0])  # its handler raises (KeyboardInterrupt) or ends the process
    if received:
        raise LaunchCancelled(f"stopped by {signal.Signals(received[0]).name}: every process was stopped")


def start_group(
    command: Sequence[str],
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    **more: Any,
) -> subprocess.Popen:
    """`command` started in a process group of its own (so it is stopped as a whole, `ProcessTree`), its
    stdout and stderr merged into one pipe of text lines, no stdin; `more`: Popen's other arguments."""
    return subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env=env,
        cwd=cwd,
        start_new_session=True,
        **more,
    )


def run_process_tree(
    command: Sequence[str],
    on_line: Callable[[str], None],
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    cancel: threading.Event | None = None,
    grace_seconds: float = 10.0,
) -> int:
    """Run `command`, stdout and stderr merged, each line (without its newline) to `on_line` as it
    comes; return its exit code. A set `cancel` event, SIGTERM, Ctrl-C (at any moment, start-up
    included) or an exception from `on_line` stops the whole process tree first; cancellation then
    raises `LaunchCancelled`, a signal is delivered again to its previous handler."""
    with stop_requests() as requests:
        process = start_group(command, env, cwd)  # a terminal's Ctrl-C reaches us: we stop the tree
        tree = ProcessTree(process)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True).start()
        try:
            return _watch(process, lines, on_line, requests, cancel)
        except BaseException:
            killed = tree.stop(grace_seconds, hurry=lambda: len(requests) > 1)
            if killed:
                print(
                    f"warning: {len(killed)} process(es) still ran {grace_seconds:.0f} s after SIGTERM (or "
                    f"at a second Ctrl-C) and were killed: {' '.join(map(str, killed))}",
                    file=sys.stderr,
                    flush=True,
                )
            raise


def _watch(
    process: subprocess.Popen,
    lines: queue.Queue,
    on_line: Callable[[str], None],
    requests: list[int],
    cancel: threading.Event | None,
) -> int:
    while True:
        if requests:
            raise StopRequested
        if cancel is not None and cancel.is_set():
            raise LaunchCancelled("cancelled: the launched process and every process it started were stopped")
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            continue
        if line is None:
            return process.wait()
        on_line(line.rstrip("\n"))


def on_parent_death(signum: int) -> None:
    """Ask Linux to send this process `signum` when its parent dies, however it dies (Linux only; a
    no-op elsewhere). Safe in a child between fork and exec (`preexec_fn`): it survives the exec."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signum)


def die_with_parent(variable: str = LAUNCHER_PID_VARIABLE) -> None:
    """Ask Linux to SIGTERM this process when the process that started it dies (however it dies: a
    SIGKILL leaves no handler to clean up), and watch for it having died already before the request
    took effect: `variable` holds the parent's PID as the parent saw it."""
    expected = os.environ.get(variable)
    on_parent_death(signal.SIGTERM)
    if expected and str(os.getppid()) != expected:
        os.kill(os.getpid(), signal.SIGTERM)
