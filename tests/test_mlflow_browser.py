"""In a real browser (headless Chromium) on `mlflow server` over loopback: a store of two logged training runs
shows both run names on the experiment's runs page and `tokens_per_second` on a run's page; a tracked
training with a registered checkpoint shows its datasets and models on the runs page, the logged models on
the experiment's models page and `@champion` on the registered model's page.

Chromium is driven through its chromedriver (selenium), and a page is read once its scripts have shown
what the test looks for, however long the server and the scripts take: no time budget is guessed."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from process_support import reserved_port, stop_process_group
from tracking_support import tracked_training
from waiting import answers, until

from flows.cli.tracking import server_command, server_environment
from gptcore.train.records import StartupRecord, StepRecord, SummaryRecord
from tasks.params.schema import TrackingConfig
from tasks.tracking import DeliverySettings, TrackingSession
from tasks.tracking.ui import training_route, training_view_url

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="Chromium and its driver are not installed (apt-get install chromium chromium-driver)",
    ),
]
PAGE_CEILING = 120.0  # a page's words come in seconds; only a hang waits this long
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
    with reserved_port() as port:
        process = subprocess.Popen(
            server_command(models.target, "127.0.0.1", port), env=server_environment(),  # as `gptpipe ui`
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,  # its worker too
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, process)
            yield {"url": url, "runs": (session.experiment_id, run_ids), "models": models.experiment_id}
        finally:
            stop_process_group(process, grace_seconds=20)


def chromium() -> Any:
    """Headless Chromium (Debian's) with a fresh profile of its own, driven by selenium; wide, so that
    every column of the runs table shows."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--window-size=2400,1400"):  # fmt: skip
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = chromium()
    try:
        yield driver
    finally:
        driver.quit()


def shown(browser: Any, url: str, *words: str) -> str:
    """The words of the page at `url` (`text_of` its DOM) once its scripts have shown all of `words`.

    Each page is a load of its own (a new address only in its `#` part would be a route change inside
    the page before, whose words are still there); what a test asserts absent, it asserts once the page
    shows what it waited for."""
    browser.get("about:blank")
    browser.get(url)

    def words_shown() -> str:
        text = text_of(browser.page_source)
        return text if all(word in text for word in words) else ""

    return until(words_shown, f"{url} shows {words}", PAGE_CEILING, every=0.25)


def text_of(page: str) -> str:
    """The visible words of a dumped page: markup and styles gone, white space (and &nbsp;) one space."""
    words = re.sub(r"<[^>]+>", " ", re.sub(r"<style.*?</style>", " ", page, flags=re.S))
    return re.sub(r"\s+", " ", html.unescape(words))


def test_both_runs_are_listed_and_a_run_page_shows_tokens_per_second(
    served: dict[str, Any], browser: Any
) -> None:
    url, (experiment_id, run_ids) = served["url"], served["runs"]
    shown(browser, f"{url}/#/experiments/{experiment_id}/runs", *RUN_NAMES)
    shown(browser, f"{url}/#/experiments/{experiment_id}/runs/{run_ids[0]}", "tokens_per_second")


def test_the_runs_page_shows_datasets_and_models_and_the_registry_shows_the_champion(
    served: dict[str, Any], browser: Any
) -> None:
    url, experiment_id = served["url"], served["models"]
    shown(
        browser, f"{url}/#/experiments/{experiment_id}/runs",
        "Dataset", "Models",  # the columns, filled in:
        "tokens-train (", "tokens-validation (",
        f"{MODEL_NAME} v1",  # the registered version of the run's logged model
    )  # fmt: skip
    models_page = shown(
        browser, f"{url}/{training_route(f'/experiments/{experiment_id}/models')}", "gpt-best", "gpt-final"
    )
    assert "Agent versions" not in models_page, "a model-training experiment, not a GenAI application"
    # The description's alias names are shown, not read as HTML tags.
    shown(browser, f"{url}/#/models/{MODEL_NAME}", "Version 1", "@ champion", "@<method>")


def test_a_fresh_browser_opens_gptpipes_run_address_as_a_training_run_with_the_assistant_closed(
    served: dict[str, Any], browser: Any
) -> None:
    """MLflow 3.17 opens a run without a logged model as a GenAI "evaluation", with its Assistant panel
    open; the address the pipeline prints (`TrackingSession.run_url`) goes through `gptpipe ui`'s
    training-view page, after which the same browser opens every run as a training run."""
    url, (experiment_id, run_ids) = served["url"], served["runs"]
    route = f"/experiments/{experiment_id}/runs/{run_ids[0]}"
    panel = "Ask questions about your experiments"  # the open Assistant panel's words (its button has none)
    untouched = chromium()  # a browser of its own: `browser` must not have seen MLflow's first view
    try:
        shown(untouched, f"{url}/#{route}", "Evaluations", panel)  # MLflow's own first view
    finally:
        untouched.quit()
    first = shown(browser, training_view_url(url, route), "tokens_per_second")
    assert "Evaluations" not in first and panel not in first
    other = f"{url}/#/experiments/{experiment_id}/runs/{run_ids[1]}"  # as a click in the runs table opens
    later = shown(browser, other, "tokens_per_second")
    assert "Evaluations" not in later and panel not in later
