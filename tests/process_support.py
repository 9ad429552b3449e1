"""Processes a test starts and must stop: a free loopback port, a whole process group brought down, and a
Prefect home whose database is already migrated."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stop_process_group(process: subprocess.Popen, grace_seconds: float = 30) -> None:
    """SIGTERM to the process's group (it was started with `start_new_session=True`), SIGKILL after the
    grace period."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


PREFECT_TEMPLATE = Path(tempfile.gettempdir()) / f"gptpipe-test-prefect-{version('prefect')}.db"


def migrated_prefect_home(home: Path) -> Path:
    """`home` as a PREFECT_HOME whose database is already migrated: a copy of one migrated once per
    machine and Prefect version (the migrations take longer than the server's start)."""
    if not PREFECT_TEMPLATE.is_file():
        building = PREFECT_TEMPLATE.with_name(f"{PREFECT_TEMPLATE.name}.{os.getpid()}")
        prefect = Path(sys.executable).parent / "prefect"
        subprocess.run(
            [str(prefect), "server", "database", "upgrade", "-y"],
            env={**os.environ, "PREFECT_HOME": str(building)}, check=True, capture_output=True,
        )  # fmt: skip
        os.replace(building / "prefect.db", PREFECT_TEMPLATE)
        shutil.rmtree(building, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PREFECT_TEMPLATE, home / "prefect.db")
    return home
