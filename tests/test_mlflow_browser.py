"""In a real browser: `mlflow server` on loopback over a store of two logged training runs shows both run
names on the experiment's runs page and `tokens_per_second` on a run's page (headless Chromium)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from tracking_support import fresh_store

from flows.cli_tracking import server_command
from gptcore.config import TrackingConfig
from tasks.tracking import TrackingSession

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)"),
]
RUN_NAMES = ("browser-fp32-batch4", "browser-bf16-batch4")
STARTUP = {
    "device": "cpu",
    "precision": "fp32",
    "batch_size": 4,
    "grad_accum_steps": 1,
    "parameter_count": 99,
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"mlflow server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"mlflow server not healthy at {url} within {seconds:.0f} s")


@pytest.fixture
def served_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, list[str]]]:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = TrackingConfig(uri=fresh_store(tmp_path), artifact_root=str(tmp_path / "mlruns" / "artifacts"))
    session = TrackingSession.open(config, experiment="browser")
    run_ids = []
    for name in RUN_NAMES:
        callback = session.training_callback(name, system_metrics=False, flush_seconds=0.05)
        callback.on_start(STARTUP)
        for step in (1, 2):
            callback.on_step({"step": step, "train_loss": 4.0 / step, "tokens_per_second": 1000.0 * step})
        callback.on_end({"steps": 2, "elapsed_seconds": 1.0})
        run_ids.append(callback.run_id)
    port = free_port()
    process = subprocess.Popen(
        server_command(session.target, "127.0.0.1", port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the workers go down with it
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
        yield url, session.experiment_id, run_ids
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def rendered(url: str) -> str:
    """The page's DOM after its scripts ran, as headless Chromium sees it."""
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--virtual-time-budget=10000", "--dump-dom", url]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    return result.stdout


def test_both_runs_are_listed_and_a_run_page_shows_tokens_per_second(
    served_store: tuple[str, str, list[str]],
) -> None:
    url, experiment_id, run_ids = served_store
    runs_page = rendered(f"{url}/#/experiments/{experiment_id}/runs")
    assert all(name in runs_page for name in RUN_NAMES), "run names missing from the runs page"
    run_page = rendered(f"{url}/#/experiments/{experiment_id}/runs/{run_ids[0]}")
    assert "tokens_per_second" in run_page
