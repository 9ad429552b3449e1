"""`python -S tests/forked_gptpipe.py ARGS`: `gptpipe ARGS` (with `-m MODULE ARGS`: `python -m MODULE
ARGS`), forked by the suite's fork server (tests/fork_server.py, found through GPTPIPE_FORK_SERVER) from
a process that has imported what a command needs: the command's own process, on this one's folder,
environment and standard streams. This one stands in for it: it passes on SIGINT, SIGTERM and SIGHUP,
and exits as the command exited (its code, or killed by the same signal). Without a server it becomes
`gptpipe` itself. Standard library only (`-S`: no site-packages), so that it starts in milliseconds."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

from fork_server import LENGTH  # the protocol's framing (its module imports nothing heavy at the top)

RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def receive_number(connection: socket.socket) -> int:
    data = b""
    while len(data) < LENGTH.size:
        more = connection.recv(LENGTH.size - len(data))
        if not more:
            print(
                "error: the suite's fork server closed the connection (tests/fork_server.py)", file=sys.stderr
            )
            sys.exit(70)
        data += more
    return LENGTH.unpack(data)[0]


def die_with_parent() -> None:
    """Killed when the process that started this one dies (the server then kills the command's session),
    as `gptcore.tools.processes.die_with_parent` has a launched process killed with its launcher (that
    module's `on_parent_death`, which this program cannot import: it needs site-packages)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def main() -> None:
    server = os.environ.get("GPTPIPE_FORK_SERVER")
    if not server:
        command = sys.argv[1:] if sys.argv[1:2] == ["-m"] else ["-m", "flows.cli.main", *sys.argv[1:]]
        os.execv(sys.executable, [sys.executable, *command])
    die_with_parent()
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(server)
    fields = {"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ), "parent": os.getppid()}
    payload = json.dumps(fields).encode()
    message = LENGTH.pack(len(payload)) + payload
    sent = socket.send_fds(connection, [message], [0, 1, 2])
    connection.sendall(message[sent:])
    pid = receive_number(connection)
    for relayed in RELAYED:
        signal.signal(relayed, lambda number, _: os.kill(pid, number))
    status = receive_number(connection)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number != signal.SIGKILL:  # whose disposition cannot be changed (nor needs to be)
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
