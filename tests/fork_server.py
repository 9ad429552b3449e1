"""`python tests/fork_server.py SOCKET`: `gptpipe` processes started from one that has imported torch,
Prefect and MLflow already, for the suite's tests of what a command's process does (its exit code, its
one-line error, its stdout, a cache the next process reads).

A `gptpipe` process spends most of its start importing (~2-5 CPU-seconds on a 2-core AVX2 machine; the
suite starts about a hundred). Here a test runs `tests/forked_gptpipe.py ARGS` (FORKED_GPTPIPE in
tests/process_support.py), a small program that hands its argv, folder, environment and standard
streams to this server and waits; the server forks, and the fork runs the command as `gptpipe` would
(`flows.cli.main.entry`) in a session of its own, on those streams: a real process with its own pid,
exit code and files. The stand-in relays SIGINT, SIGTERM and SIGHUP to it and exits as it exited;
killed itself, it takes the command's session along. `forked_gptpipe.py -m MODULE ARGS` runs a module
instead, as `python -m MODULE ARGS` would: the suite's GPTPIPE_PYTHON, so that a training on several
processes forks its torchrun launcher and ranks too.

What a fork does not redo is the start: modules imported before its environment was set (what they
read from the environment at import, the warnings they print then); nor the end's teardown of every
module (its threads are joined, its atexit functions run and its output flushed, as at any exit). Tests
of the start (lazy imports, a first run's warnings, a terminal), of a process tree brought down by its
group, or of a process stopped or killed by the test start `gptpipe` itself.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LENGTH = struct.Struct("!I")  # a message's length before it
# What `gptpipe` commands import as they run (flows.cli.main imports them only then).
PRELOADED = (
    "torch",
    "torch._dynamo",  # an optimizer's construction imports it (torch._disable_dynamo)
    "prefect",
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",
    "datasets",
    "flows.pipeline",
    "flows.finetune",
    "flows.sweep",
    "flows.scale",
    "flows.cli.train",
    "flows.cli.models",
    "flows.cli.tracking",
    "flows.cli.servers",
    "gptcore.train.multiprocess",  # a rank's module (GPTPIPE_PYTHON: the launcher and ranks fork)
    "torch.distributed.run",
)


@dataclass
class Request:
    """What the stand-in hands over: the command's argv (after `gptpipe`, or `-m MODULE ARGS`), its
    folder and environment, and its stdin, stdout and stderr."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    fds: list[int]
    parent: int  # the stand-in's parent, which it dies with


def preload() -> None:
    sys.path.insert(0, str(REPO))
    from gptcore.runtime.malloc import tune_malloc

    tune_malloc()  # as `gptpipe` does first thing: before torch is imported, or it does not take
    from flows.cli.main import _register_commands, quiet_libraries

    quiet_libraries(verbose=False)
    _register_commands()
    for module in PRELOADED:
        __import__(module)
    # Out of the collector's sight: a fork's collections would otherwise write to every object's header,
    # and so copy every page of the server's heap into the fork.
    gc.freeze()


def receive(connection: socket.socket) -> Request:
    data, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    while len(data) < LENGTH.size or len(data) < LENGTH.size + LENGTH.unpack_from(data)[0]:
        more = connection.recv(1 << 20)
        if not more:
            raise ConnectionError("the stand-in left before its request was whole")
        data += more
    fields = json.loads(data[LENGTH.size :])
    return Request(fields["argv"], fields["cwd"], fields["env"], list(fds), fields["parent"])


def listening(path: str) -> socket.socket:
    """The server's socket, listening before the imports: a stand-in that comes meanwhile waits in the
    queue, not for a file to appear."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("listening", flush=True)  # what the suite waits for (tests/process_support.py fork_server)
    return listener


def serve(listener: socket.socket) -> Request:
    """Fork a command for each stand-in that connects; tell it the command's pid, then its wait status.
    Returns only in a fork, with the request it is to run."""
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a child's end wakes the loop (through the pipe)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wakeup_read, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                connection, _ = listener.accept()
                try:
                    request = receive(connection)
                except (OSError, ValueError, ConnectionError):
                    connection.close()
                    continue
                pid = os.fork()
                if pid == 0:  # the command's process: nothing of the server's stays open in it
                    signal.set_wakeup_fd(-1)
                    for handled in (signal.SIGCHLD, signal.SIGTERM):
                        signal.signal(handled, signal.SIG_DFL)
                    for kept in (listener, connection, *children.values()):
                        kept.close()
                    os.close(wakeup_read)
                    os.close(wakeup_write)
                    selector.close()
                    return request
                for fd in request.fds:
                    os.close(fd)
                connection.sendall(LENGTH.pack(pid))
                children[pid] = connection
                selector.register(connection, selectors.EVENT_READ, pid)
            elif key.fileobj == wakeup_read:
                os.read(wakeup_read, 4096)
                reap(children, selector)
            else:  # a stand-in said nothing more, so it has gone: killed, it takes the command along
                connection, pid = key.fileobj, key.data
                if not connection.recv(1):  # type: ignore[union-attr]
                    selector.unregister(connection)
                    kill_session(pid)


def kill_session(pid: int) -> None:
    for kill in (os.killpg, os.kill):  # the process too: it may not have made its session yet
        with contextlib.suppress(ProcessLookupError):
            kill(pid, signal.SIGKILL)


def reap(children: dict[int, socket.socket], selector: selectors.BaseSelector) -> None:
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        connection = children.pop(pid, None)
        if connection is None:
            continue
        with contextlib.suppress(KeyError):  # unregistered when its stand-in left
            selector.unregister(connection)
        with contextlib.suppress(OSError):
            connection.sendall(LENGTH.pack(status))
        connection.close()


def run(request: Request) -> None:
    """In the fork: the command as the `gptpipe` program would run it, on the stand-in's streams, in its
    folder and environment, in a session of its own (a signal to its group reaches what it started)."""
    os.setsid()
    for target, fd in enumerate(request.fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    from gptcore.tools.processes import LAUNCHER_PID_VARIABLE  # imported by the server already

    if os.environ.get(LAUNCHER_PID_VARIABLE) == str(request.parent):
        # Its launcher, for die_with_parent: the stand-in's parent, which the stand-in dies with (and this
        # session with the stand-in); this process's own parent is the server.
        os.environ[LAUNCHER_PID_VARIABLE] = str(os.getppid())
    sys.stdout.reconfigure(line_buffering=os.isatty(1))  # as Python sets it up at a start
    if "OMP_NUM_THREADS" in request.env:  # read by torch when it was imported, here
        import torch

        torch.set_num_threads(int(request.env["OMP_NUM_THREADS"]))
    level = request.env.get("MLFLOW_LOGGING_LEVEL")
    if level:  # read by MLflow when it was imported, here
        import logging

        logging.getLogger("mlflow").setLevel(level.upper())
    from in_process import prefect_settings_of_environment

    try:
        with prefect_settings_of_environment():  # Prefect read them at import: again, the command's
            command(request.argv)
        code = 0
    except SystemExit as exit_:
        code = exit_code(exit_)
    except BaseException:
        sys.excepthook(*sys.exc_info())  # the traceback, as an uncaught exception's
        code = 1
    leave(code)


def command(argv: list[str]) -> None:
    """`gptpipe ARGV`, or with `-m MODULE ARGS` that module as `python -m` runs it."""
    if argv[:1] == ["-m"]:
        import runpy
        import warnings

        # Imported here already (by the preloaded flows), it runs again as __main__, as intended.
        warnings.filterwarnings("ignore", r".* found in sys\.modules after import", RuntimeWarning, "runpy")
        sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file first
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    from flows.cli.main import entry

    sys.argv = [str(REPO / "flows" / "cli" / "main.py"), *argv]
    entry()


def exit_code(exit_: SystemExit) -> int:
    """The status `sys.exit(value)` gives a process: 0 for None, the number, else 1 (the value printed)."""
    if exit_.code is None or isinstance(exit_.code, int):
        return exit_.code or 0
    print(exit_.code, file=sys.stderr)
    return 1


def leave(code: int) -> None:
    """End as Python ends a process (its non-daemon threads joined, its atexit functions run, its output
    flushed) but for the teardown of every module: in a fork, that would copy most of the server's heap
    page by page (each object's reference count written) to no end, about 0.3 s a command."""
    threading._shutdown()  # type: ignore[attr-defined]  # what Python's own finalization calls first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    socket_path = sys.argv[1]
    waiting = listening(socket_path)
    preload()
    from gptcore.tools.processes import die_with_parent

    die_with_parent()  # the pytest worker that started it gone in any way, so is the server
    run(serve(waiting))
