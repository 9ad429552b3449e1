"""The run writer: every call into the store off the training thread, bounded, redacted, batched."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from tracking_support import Waits, fresh_store, three_step_job
from waiting import until

from gptcore.train.records import StartupRecord, StepRecord, SummaryRecord
from gptcore.train.trainer import train
from tasks.params.schema import TrackingConfig
from tasks.tracking import DeliverySettings, MLflowCallback, RunWriter, TrackingSession, training_metadata
from tasks.tracking.delivery.operations import PARAM_VALUE_LIMIT
from tasks.tracking.delivery.outbox import Outbox

CEILING = 120.0  # a wait for an event ends a hang here, far above the honest few milliseconds


@pytest.fixture
def session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TrackingSession:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    art = str(tmp_path / "art")
    return TrackingSession.open(TrackingConfig(uri=fresh_store(tmp_path), artifact_root=art, experiment="w"))


class CountingClient:
    """An MlflowClient that counts its log_batch calls."""

    def __init__(self, client: Any) -> None:
        self._client, self.batches = client, []

    def log_batch(self, run_id: str, **parts: Any) -> None:
        self.batches.append({name: len(values) for name, values in parts.items()})
        self._client.log_batch(run_id, **parts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class SwitchedClient:
    """A store that refuses connections while `away`, as a stopped server does."""

    def __init__(self, client: Any) -> None:
        self._client, self.away = client, False

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.away:
                raise ConnectionRefusedError(111, "Connection refused")
            return attribute(*args, **kwargs)

        return call


class HangingClient:
    """A tracking server lost after the store check: the named calls never return until released."""

    def __init__(self, client: Any, hanging: set[str]) -> None:
        self._client, self.hanging = client, hanging
        self.release = threading.Event()
        self.callers: set[str] = set()  # the threads that called a hanging method

    def __getattr__(self, name: str) -> Any:
        if name not in self.hanging:
            return getattr(self._client, name)

        def hang(*args: Any, **kwargs: Any) -> Any:
            self.callers.add(threading.current_thread().name)
            self.release.wait(600)  # the HTTP client's retry backoff, minutes long
            raise ConnectionError("tracking server went away")

        return hang


def test_params_and_tags_are_redacted_truncated_and_sent_in_batches_mlflow_accepts(
    session: TrackingSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    client = CountingClient(session.client)
    writer = RunWriter(client, delivery=DeliverySettings(flush_seconds=0.05))
    run_id = writer.create_run(session.experiment_id, "batches", {"note": "uses hf_secret_value"})
    params = {f"p{i:03d}": i for i in range(250)} | {"long": "x" * 9000, "secret": "hf_secret_value"}
    writer.log_params(run_id, params)
    writer.log_metrics(run_id, {"loss": 1.0, "rate": 0.1}, step=1)
    writer.log_metrics(run_id, {"loss": 0.5, "rate": 0.1}, step=2)
    writer.set_tags(run_id, {"state": "done", "absent": None})
    report = writer.close()

    run = session.client.get_run(run_id)
    assert len(run.data.params) == 252
    assert run.data.params["long"] == "x" * PARAM_VALUE_LIMIT
    assert run.data.params["secret"] == "***" and run.data.tags["note"] == "uses ***"
    assert run.data.tags["state"] == "done" and "absent" not in run.data.tags
    assert [b["params"] for b in client.batches if "params" in b] == [100, 100, 52]
    assert [b["metrics"] for b in client.batches if "metrics" in b] == [4]  # both steps in one call
    assert (report.sent_metrics, report.failed_calls, report.store_down) == (4, 0, False)


def test_a_store_lost_before_the_run_is_created_holds_nothing_and_its_run_is_created_by_replay(
    session: TrackingSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client = HangingClient(session.client, {"create_run", "log_batch"})
    callback = MLflowCallback(
        client,
        session.target.uri,
        session.experiment_id,
        "lost",
        system_metrics=False,
        delivery=DeliverySettings(answer_seconds=0.5),
        outbox=tmp_path / "outbox",
    )
    job = three_step_job(tmp_path / "ckpt", training_metadata([callback]))
    summary = train(job, callback)  # the store answers nothing until released, below: it ends regardless
    # its close waited one answer's bound, not the minute a store that answers is given
    assert callback.report["last_error"] == "closing: the tracking store did not answer within 0.5 s"
    client.release.set()
    assert summary.steps == 3 and (tmp_path / "ckpt" / "final.pt").is_file()
    assert callback.run_id.startswith("pending-") and "mlflow_run_id" not in job.metadata
    err = capsys.readouterr().err
    assert "waits for the tracking store (create_run: the tracking store did not answer within 0.5 s)" in err
    outbox = Path(callback.report["outbox"])
    assert f"{callback.report['waiting_records']} records wait in {outbox}" in err

    replayed = RunWriter.replay(session.client, Outbox.open(outbox))
    assert replayed.waiting_records == 0 and not outbox.exists()
    (run,) = session.client.search_runs([session.experiment_id], "attributes.run_name = 'lost'")
    assert run.info.status == "FINISHED" and run.data.params["device"] == "cpu"
    losses = session.client.get_metric_history(run.info.run_id, "train_loss")
    assert [m.step for m in losses] == [1, 2, 3]


def test_a_store_lost_mid_run_costs_a_bounded_wait_and_its_records_wait_in_the_outbox(
    session: TrackingSession,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = HangingClient(session.client, set())
    callback = MLflowCallback(
        client,
        session.target.uri,
        session.experiment_id,
        "midway",
        system_metrics=False,
        delivery=DeliverySettings(flush_seconds=0.05, answer_seconds=0.5),
        outbox=tmp_path / "outbox",
    )
    callback.on_start(StartupRecord.from_dict({"device": "cpu", "batch_size": 2}))
    waits = Waits(monkeypatch)
    client.hanging.add("log_batch")  # the server goes away after the run opened
    for step in range(1, 101):
        callback.on_step(StepRecord(step=step, train_loss=3.0, learning_rate=1e-3))
    assert waits.waited == []  # a training step never waits on the store: it only queues
    assert not client.release.is_set() and client.callers <= {"mlflow-midway"}  # only the writer calls
    callback.on_end(SummaryRecord(steps=100, final_train_loss=3.0))  # one bounded wait, then the outbox
    client.release.set()
    assert callback.report["store_down"] and callback.report["dropped_metrics"] == 0
    assert callback.report["waiting_records"] >= 200 - 1  # one batch may have reached the store
    assert "did not answer within 0.5 s" in capsys.readouterr().err


def test_metrics_beyond_the_memory_bound_spill_oldest_first_and_arrive_in_order_when_the_store_returns(
    session: TrackingSession, tmp_path: Path
) -> None:
    client = SwitchedClient(session.client)
    writer = RunWriter(
        client,
        delivery=DeliverySettings(flush_seconds=0.01, probe_seconds=0.1, memory_records=100),
        outbox=tmp_path / "outbox",
    )
    run_id = writer.create_run(session.experiment_id, "switched", {})
    assert not run_id.startswith("pending-")
    client.away = True
    writer.log_metrics(run_id, {"loss": 1.0}, 1)
    until(lambda: writer.report.failed_calls >= 1, "the first metric's call refused", CEILING)
    queue = writer._loop.queue  # step 1 is in flight, retried alone; steps 2 to 1000 queue behind it
    for step in range(2, 1001):
        writer.log_metrics(run_id, {"loss": 1.0 / step}, step)
        assert len(queue.memory) <= 100  # bounded memory: the oldest went to the outbox
    assert [item.record.step for item in queue.inflight] == [1]
    assert writer.report.spilled_records + len(queue.memory) == 999 and writer.report.spilled_records >= 900
    client.away = False
    writer.log_metrics(run_id, {"loss": 0.0}, 1001)
    report = writer.close()
    history = session.client.get_metric_history(run_id, "loss")
    assert [m.step for m in history] == list(range(1, 1002))  # no gap, in order
    assert [m.timestamp for m in history] == sorted(m.timestamp for m in history)
    assert (report.sent_metrics, report.dropped_metrics, report.waiting_records) == (1001, 0, 0)
    assert report.delivered_late >= report.spilled_records and not list((tmp_path / "outbox").glob("*.jsonl"))


def test_calls_after_the_writer_closed_are_counted_not_sent(session: TrackingSession) -> None:
    writer = RunWriter(session.client)
    run_id = writer.create_run(session.experiment_id, "closed", {})
    writer.close()
    writer.log_metrics(run_id, {"loss": 1.0}, step=1)
    writer.set_tags(run_id, {"late": "yes"})
    assert (writer.report.dropped_metrics, writer.report.given_up_calls) == (1, 1)
    assert "late" not in session.client.get_run(run_id).data.tags


def test_a_server_call_that_fails_is_retried_by_the_writer_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One retry layer: a server answering 503 sees the writer's attempts (1 + retries), each one
    request, not MLflow's HTTP retries inside each of them."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from mlflow import MlflowClient

    from tasks.tracking.store import HTTP_DEFAULTS

    requests: list[str] = []

    class Unavailable(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            self.send_response(503)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for name, value in HTTP_DEFAULTS.items():  # what gptpipe sets for a server store
        monkeypatch.setenv(name, value)
    client = MlflowClient(tracking_uri=f"http://127.0.0.1:{server.server_address[1]}")
    # The caller waits for its answer (the first failure), never for a guessed while that would count an
    # outage of its own: only the writer's third failed attempt begins the outage here.
    delivery = DeliverySettings(retries=2, backoff_seconds=0.01, probe_seconds=600, answer_seconds=CEILING)
    writer = RunWriter(client, delivery=delivery, outbox=tmp_path)
    try:
        assert writer.ask("experiment", client.get_experiment, "0") is None
        until(lambda: writer.report.outages, "the writer gave up after its retries", CEILING)
        assert writer.report.outages == 1 and len(requests) == 3
    finally:
        writer.close()
        server.shutdown()
