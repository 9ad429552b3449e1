"""`python -m flows.environment.prefect_server FD`: uvicorn serving Prefect's API on the listening socket
FD, imported quickly.

The temporary server (see `flows.environment.prefect_settings.TemporaryServer`) spends most of its start
importing Prefect's server package; doing that inside `bulk_imports` takes about a second off on this
machine. Its socket is made and bound by the process that starts it, which so knows the port at once
and never hands on a port number for another process to take meanwhile.
"""

from __future__ import annotations

import socket
import sys

from flows.environment.gc_tuning import bulk_imports

FACTORY = "prefect.server.api.server:create_app"  # what Prefect's own temporary server runs
STARTUP_FAILURE = 3  # uvicorn's exit status when the app did not start (its lifespan failed)


def main() -> None:
    from gptcore.tools.processes import die_with_parent

    die_with_parent()  # `gptpipe run` killed in any way takes its temporary server along
    # The socket's family and type are read from it: uvicorn's own `--fd` would take it for a Unix
    # socket, and asyncio would then leave Nagle's algorithm on for every connection.
    listener = socket.socket(fileno=int(sys.argv[1]))
    with bulk_imports():
        import prefect.server.api.server  # noqa: F401  (the app factory uvicorn is about to load)
        import uvicorn
    config = uvicorn.Config(FACTORY, factory=True, log_level="error", lifespan="on")
    server = uvicorn.Server(config)
    server.run(sockets=[listener])
    if not server.started:
        sys.exit(STARTUP_FAILURE)


if __name__ == "__main__":
    main()
