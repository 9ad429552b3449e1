"""Shared fixtures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and a shared, loaded CPU makes two threads crawl."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def prefect_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One temporary Prefect server for the module, its state under a temporary PREFECT_HOME."""
    home = tmp_path_factory.mktemp("prefect-home")
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(home / "storage"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
    }
    env.pop("PREFECT_API_URL", None)
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER_SCRIPT], env=env, stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert server.stdout is not None
    url = server.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), url
    yield {**env, "PREFECT_API_URL": url}
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=20)


_SERVER_SCRIPT = """
import signal, sys, threading
from prefect.server.api.server import SubprocessASGIServer
server = SubprocessASGIServer()
server.start(timeout=60)
print(server.api_url, flush=True)
signal.signal(signal.SIGTERM, lambda *_: (server.stop(), sys.exit(0)))
threading.Event().wait()
"""
