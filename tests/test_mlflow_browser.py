"""In a real browser (headless Chromium) on `mlflow server` over loopback: a store of two logged training runs
shows both run names on the experiment's runs page and `tokens_per_second` on a run's page; a tracked
training with a registered checkpoint shows its datasets and models on the runs page, the logged models on
the experiment's models page and `@champion` on the registered model's page."""

from __future__ import annotations

import contextlib
import html
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from process_support import free_port, stop_process_group
from tracking_support import fresh_store, tracked_training

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
MODEL_NAME = "gptpipe-iteration-1"
STARTUP = {
    "device": "cpu",
    "precision": "fp32",
    "batch_size": 4,
    "grad_accum_steps": 1,
    "parameter_count": 99,
}


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


@contextlib.contextmanager
def mlflow_server(target: str) -> Iterator[str]:
    """`gptpipe ui`'s server command over `target` on a free loopback port; yields its URL."""
    port = free_port()
    process = subprocess.Popen(
        server_command(target, "127.0.0.1", port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the workers go down with it
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
        yield url
    finally:
        stop_process_group(process, grace_seconds=20)


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
    with mlflow_server(session.target) as url:
        yield url, session.experiment_id, run_ids


@pytest.fixture
def served_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """A tracked training whose best checkpoint is registered as `gptpipe-iteration-1` (so `@champion`)."""
    from tasks.tracking.registry import register

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    session, callback, run = tracked_training(tmp_path, experiment="browser-models")
    register(session.client, session.experiment_id, callback.run_id, MODEL_NAME, run / "best.pt", 2.5)
    with mlflow_server(session.target) as url:
        yield url, session.experiment_id


def rendered(url: str, budget_ms: int = 10000) -> str:
    """The page's DOM after its scripts ran (`budget_ms` of virtual time), as headless Chromium sees it."""
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--window-size=2400,1400", f"--virtual-time-budget={budget_ms}",  # wide: every column shows
               "--dump-dom", url]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    return result.stdout


def text_of(page: str) -> str:
    """The visible words of a dumped page: markup and styles gone, white space (and &nbsp;) one space."""
    words = re.sub(r"<[^>]+>", " ", re.sub(r"<style.*?</style>", " ", page, flags=re.S))
    return re.sub(r"\s+", " ", html.unescape(words))


def test_both_runs_are_listed_and_a_run_page_shows_tokens_per_second(
    served_store: tuple[str, str, list[str]],
) -> None:
    url, experiment_id, run_ids = served_store
    runs_page = rendered(f"{url}/#/experiments/{experiment_id}/runs")
    assert all(name in runs_page for name in RUN_NAMES), "run names missing from the runs page"
    run_page = rendered(f"{url}/#/experiments/{experiment_id}/runs/{run_ids[0]}")
    assert "tokens_per_second" in run_page


def test_the_runs_page_shows_datasets_and_models_and_the_registry_shows_the_champion(
    served_models: tuple[str, str],
) -> None:
    url, experiment_id = served_models
    runs_page = text_of(rendered(f"{url}/#/experiments/{experiment_id}/runs", budget_ms=15000))
    assert "Dataset" in runs_page and "Models" in runs_page  # the columns, filled in:
    assert "tokens-train (" in runs_page and "tokens-validation (" in runs_page
    assert f"{MODEL_NAME} v1" in runs_page  # the registered version of the run's logged model
    models_page = text_of(rendered(f"{url}/#/experiments/{experiment_id}/models"))
    assert "gpt-best" in models_page and "gpt-final" in models_page
    registry_page = text_of(rendered(f"{url}/#/models/{MODEL_NAME}"))
    assert "Version 1" in registry_page and "@ champion" in registry_page
