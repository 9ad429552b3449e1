"""Processes a test starts and must stop: a free loopback port, and a whole process group brought down."""

from __future__ import annotations

import os
import signal
import socket
import subprocess


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
