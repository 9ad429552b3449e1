"""In a real browser (headless Chromium) on `mlflow server` over loopback: a store of two logged training runs
shows both run names on the experiment's runs page and `tokens_per_second` on a run's page; a tracked
training with a registered checkpoint shows its datasets and models on the runs page, the logged models on
the experiment's models page and `@champion` on the registered model's page."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from process_support import free_port, stop_process_group
from tracking_support import tracked_training
from waiting import answers, until

from flows.cli.tracking import server_command, server_environment
from gptcore.train.records import StartupRecord, StepRecord, SummaryRecord
from tasks.params.schema import TrackingConfig
from tasks.tracking import DeliverySettings, TrackingSession
from tasks.tracking.ui import training_route, training_view_url

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)"),
]
RUN_NAMES = ("browser-fp32-batch4", "browser-bf16-batch4")
MODEL_NAME = "gptpipe-iteration-1"
STARTUP_FIELDS = {
    "device": "cpu",
    "precision": "fp32",
    "batch_size": 4,
    "grad_accum_steps": 1,
    "parameter_count": 99,
}


def startup(**changes: Any) -> StartupRecord:
    """The trainer's start-up record of a small CPU run, with `changes`."""
    return StartupRecord.from_dict({**STARTUP_FIELDS, **changes})


def wait_healthy(url: str, process: subprocess.Popen) -> None:
    def healthy() -> bool:
        if process.poll() is not None:
            pytest.fail(f"mlflow server exited with {process.returncode}")
        return answers(f"{url}/health")

    until(healthy, f"mlflow server healthy at {url}")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One store and one `gptpipe ui` server for the module: two short runs in experiment `browser`, and a
    tracked training whose best checkpoint is registered as `gptpipe-iteration-1` (so `@champion`) in
    experiment `browser-models`."""
    from tasks.tracking.models.registry import register

    folder = tmp_path_factory.mktemp("browser")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        models, callback, run = tracked_training(folder, experiment="browser-models")
        register(models.client, models.experiment_id, callback.run_id, MODEL_NAME, run / "best.pt", 2.5)
        session = TrackingSession.open(TrackingConfig(uri=models.target.uri), experiment="browser")
        run_ids = []
        for name in RUN_NAMES:
            callback = session.training_callback(
                name, system_metrics=False, delivery=DeliverySettings(flush_seconds=0.05)
            )
            callback.on_start(startup())
            for step in (1, 2):
                callback.on_step(
                    StepRecord.from_dict(
                        {"step": step, "train_loss": 4.0 / step, "tokens_per_second": 1000.0 * step}
                    )
                )
            callback.on_end(SummaryRecord.from_dict({"steps": 2, "elapsed_seconds": 1.0}))
            run_ids.append(callback.run_id)
    port = free_port()
    process = subprocess.Popen(
        server_command(models.target, "127.0.0.1", port), env=server_environment(),  # as `gptpipe ui` runs it
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,  # its worker goes too
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
        yield {"url": url, "runs": (session.experiment_id, run_ids), "models": models.experiment_id}
    finally:
        stop_process_group(process, grace_seconds=20)


def rendered(url: str, budget_ms: int = 10000, profile: Path | None = None) -> str:
    """The page's DOM after its scripts ran (`budget_ms` of virtual time), as headless Chromium sees it;
    in the browser profile `profile` (kept between calls: its localStorage too), else a fresh one."""
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--window-size=2400,1400", f"--virtual-time-budget={budget_ms}",  # wide: every column shows
               "--dump-dom", url]  # fmt: skip
    if profile is not None:
        command.insert(1, f"--user-data-dir={profile}")
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    return result.stdout


def text_of(page: str) -> str:
    """The visible words of a dumped page: markup and styles gone, white space (and &nbsp;) one space."""
    words = re.sub(r"<[^>]+>", " ", re.sub(r"<style.*?</style>", " ", page, flags=re.S))
    return re.sub(r"\s+", " ", html.unescape(words))


def test_both_runs_are_listed_and_a_run_page_shows_tokens_per_second(served: dict[str, Any]) -> None:
    url, (experiment_id, run_ids) = served["url"], served["runs"]
    runs_page = rendered(f"{url}/#/experiments/{experiment_id}/runs")
    assert all(name in runs_page for name in RUN_NAMES), "run names missing from the runs page"
    run_page = rendered(f"{url}/#/experiments/{experiment_id}/runs/{run_ids[0]}")
    assert "tokens_per_second" in run_page


def test_the_runs_page_shows_datasets_and_models_and_the_registry_shows_the_champion(
    served: dict[str, Any],
) -> None:
    url, experiment_id = served["url"], served["models"]
    runs_page = text_of(rendered(f"{url}/#/experiments/{experiment_id}/runs", budget_ms=15000))
    assert "Dataset" in runs_page and "Models" in runs_page  # the columns, filled in:
    assert "tokens-train (" in runs_page and "tokens-validation (" in runs_page
    assert f"{MODEL_NAME} v1" in runs_page  # the registered version of the run's logged model
    models_page = text_of(rendered(f"{url}/{training_route(f'/experiments/{experiment_id}/models')}"))
    assert "gpt-best" in models_page and "gpt-final" in models_page
    assert "Agent versions" not in models_page, "a model-training experiment, not a GenAI application"
    registry_page = text_of(rendered(f"{url}/#/models/{MODEL_NAME}"))
    assert "Version 1" in registry_page and "@ champion" in registry_page
    assert "@<method>" in registry_page, "the description's alias names are shown, not read as HTML tags"


def test_a_fresh_browser_opens_gptpipes_run_address_as_a_training_run_with_the_assistant_closed(
    served: dict[str, Any], tmp_path: Path
) -> None:
    """MLflow 3.17 opens a run without a logged model as a GenAI "evaluation", with its Assistant panel
    open; the address the pipeline prints (`TrackingSession.run_url`) goes through `gptpipe ui`'s
    training-view page, after which the same browser opens every run as a training run."""
    url, (experiment_id, run_ids) = served["url"], served["runs"]
    route = f"/experiments/{experiment_id}/runs/{run_ids[0]}"
    panel = "Ask questions about your experiments"  # the open Assistant panel's words (its button has none)
    plain = text_of(rendered(f"{url}/#{route}", profile=tmp_path / "untouched"))
    assert "Evaluations" in plain and panel in plain, "MLflow's own first view"
    first = text_of(rendered(training_view_url(url, route), profile=tmp_path / "fresh"))
    assert "tokens_per_second" in first and "Evaluations" not in first and panel not in first
    other = f"{url}/#/experiments/{experiment_id}/runs/{run_ids[1]}"  # as a click in the runs table opens
    later = text_of(rendered(other, profile=tmp_path / "fresh"))
    assert "tokens_per_second" in later and "Evaluations" not in later and panel not in later
