"""`python -m flows.environment.prefect_server UVICORN-ARGS`: uvicorn serving Prefect's API, imported
quickly.

The temporary server (see `flows.environment.prefect_settings.TemporaryServer`) spends most of its start
importing Prefect's server package; doing that inside `bulk_imports` takes about a second off on this
machine.
"""

from __future__ import annotations

import sys

from flows.environment.gc_tuning import bulk_imports


def main() -> None:
    from gptcore.tools.processes import die_with_parent

    die_with_parent()  # `gptpipe run` killed in any way takes its temporary server along
    with bulk_imports():
        import prefect.server.api.server  # noqa: F401  (the app factory uvicorn is about to load)
        from uvicorn.main import main as uvicorn_main
    sys.argv[0] = "uvicorn"
    uvicorn_main()


if __name__ == "__main__":
    main()
