"""`python -S tests/forked_gptpipe.py ARGS`: `gptpipe ARGS`, forked by the suite's fork server
(tests/fork_server.py, found through GPTPIPE_FORK_SERVER) from a process that has imported what a command
needs: the command's own process, on this one's folder, environment and standard streams. This one
stands in for it: it passes on SIGINT, SIGTERM and SIGHUP, and exits as the command exited (its code,
or killed by the same signal). Without a server it becomes `gptpipe` itself. Standard library only, so
that it starts in milliseconds."""

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


def main() -> None:
    server = os.environ.get("GPTPIPE_FORK_SERVER")
    if not server:
        os.execv(sys.executable, [sys.executable, "-m", "flows.cli.main", *sys.argv[1:]])
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(server)
    payload = json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    message = LENGTH.pack(len(payload)) + payload
    sent = socket.send_fds(connection, [message], [0, 1, 2])
    connection.sendall(message[sent:])
    pid = receive_number(connection)
    for relayed in RELAYED:
        signal.signal(relayed, lambda number, _: os.kill(pid, number))
    status = receive_number(connection)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
