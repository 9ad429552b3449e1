"""A real `mlflow server` on loopback goes out of reach during a training and comes back: the training goes
on without waiting on it, its records reach the store in order with their original steps when the server
returns (same port, same store), and when it does not return before the run ends, the records wait in an
outbox that `gptpipe tracking replay` delivers later."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from fault_support import TINY_PARAMS
from process_support import FORKED_GPTPIPE, STARTED_GPTPIPE, reserved_port, stop_process_group
from test_mlflow_browser import wait_healthy
from tracking_support import Waits, fresh_store, three_step_job
from waiting import until

from flows.cli.tracking import server_command, server_environment
from gptcore.train.callbacks import CallbackList, TrainingCallback
from gptcore.train.records import StartupRecord, StepRecord
from gptcore.train.trainer import train
from tasks.params.schema import TrackingConfig
from tasks.tracking import DeliverySettings, TrackingSession, training_metadata
from tasks.tracking.store import resolve_target

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent


class Server:
    """`mlflow server` over one SQLite store, reached through one loopback port that goes away and comes
    back at will: `stop()` closes the port (a connection to it is refused, as to a server that has gone)
    and cuts every open connection (as a stopping server closes them), `start()` opens it again. The
    server process itself runs throughout on a port of its own, started once: a start of it costs about 9
    CPU-seconds, and what the client sees of a server going away is its port. Both ports are held for the
    test (`reserved_port`), so no other process takes them meanwhile."""

    def __init__(self, folder: Path, port: int, inner: int) -> None:
        uri = fresh_store(folder)
        artifacts = str(folder / "mlruns" / "artifacts")
        self.target = resolve_target(TrackingConfig(uri=uri, artifact_root=artifacts))
        self.port, self.inner = port, inner
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.listener: socket.socket | None = None
        self.connections: set[socket.socket] = set()
        self.lock = threading.Lock()

    @property
    def away(self) -> bool:
        return self.listener is None

    def start(self) -> None:
        if self.process is None:
            command = server_command(self.target, "127.0.0.1", self.inner)
            self.process = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                env=server_environment(),  # as `gptpipe ui` runs it
            )  # fmt: skip
            wait_healthy(f"http://127.0.0.1:{self.inner}", self.process)
        listener = socket.socket()
        listener.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
        )  # shares the held port, as uvicorn does
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        listener, self.listener = self.listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
            listener.close()
        with self.lock:
            for connection in self.connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
            self.connections.clear()

    def close(self) -> None:
        self.stop()
        if self.process is not None:
            stop_process_group(self.process, grace_seconds=10)
            self.process = None

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed: the server has gone
            server = socket.create_connection(("127.0.0.1", self.inner))
            with self.lock:
                if self.listener is not listener:  # stopped meanwhile
                    client.close()
                    server.close()
                    continue
                self.connections |= {client, server}
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Bytes from `source` to `sink` until either side ends; then both ends are closed for sending."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    for end in (sink, source):
        with contextlib.suppress(OSError):
            end.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    with reserved_port() as port, reserved_port() as inner:
        server = Server(tmp_path, port, inner)
        server.start()
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
        yield server
        server.close()


class Outages(TrainingCallback):
    """Stops the server before the run is created and at `stop_at`, starts it again at `start_at`: each
    time once the writer has seen the change (it declared the store away; it delivered a record that
    waited), since an absence shorter than its retries is no outage, and a tiny model's steps are far
    shorter than either."""

    def __init__(self, server: Server, start_at: set[int], stop_at: set[int], writer: Any) -> None:
        self.server, self.start_at, self.stop_at, self.report = server, start_at, stop_at, writer.report
        self.stops, self.late = 0, 0

    def on_start(self, startup: StartupRecord) -> None:
        self._stop()  # gone before the run is created

    def on_step(self, record: StepRecord) -> None:
        if record.step in self.start_at:
            until(lambda: self.report.outages >= self.stops, f"the writer declared outage {self.stops}")
            self.late = self.report.delivered_late
            self.server.start()
        if record.step in self.stop_at:
            until(lambda: self.report.delivered_late > self.late, "the writer saw the store return")
            self._stop()

    def _stop(self) -> None:
        self.server.stop()
        self.stops += 1


def test_a_server_stopped_at_the_start_and_midway_gets_every_record_in_order_when_it_returns(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = TrackingSession.open(TrackingConfig(experiment="outage"))
    tracking = session.training_callback(
        "outage",
        system_metrics=False,
        delivery=DeliverySettings(flush_seconds=0.1, probe_seconds=0.5),
        outbox=tmp_path / "outbox",
    )
    outages = Outages(server, start_at={8, 24}, stop_at={16}, writer=tracking.writer)
    job = three_step_job(tmp_path / "ckpt", training_metadata([tracking]))
    longer = job.training.model_copy(update={"max_steps": 30, "eval_every": 30})
    job = dataclasses.replace(job, training=longer)
    waits = Waits(monkeypatch, when=lambda: "away" if server.away else "up")
    summary = train(job, CallbackList([outages, tracking]))  # the server stops before the run is created

    assert summary.steps == 30
    # The training thread waited on the absent server once, for the run's creation (answered by the
    # writer's refused attempt: a pending key); never for a step or a checkpoint's model.
    assert waits.on(threading.current_thread().name, when="away") == ["create_run"]
    report = tracking.report
    assert report["outages"] >= 1 and report["waiting_records"] == 0 and report["dropped_metrics"] == 0
    run = session.client.get_run(tracking.run_id)
    assert run.info.status == "FINISHED" and run.data.params["device"] == "cpu"
    history = session.client.get_metric_history(tracking.run_id, "train_loss")
    assert [m.step for m in history] == list(range(1, 31))  # no gap, in order
    assert [m.timestamp for m in history] == sorted(m.timestamp for m in history)
    assert job.metadata["mlflow_run_id"] == tracking.run_id  # created late, still in the checkpoints


def test_a_server_that_never_returns_during_gptpipe_train_leaves_an_outbox_that_replay_delivers(
    server: Server, tmp_path: Path
) -> None:
    full = {"epochs": 1, "training_examples": 400, "validation_examples": 8}
    params = {**TINY_PARAMS, "full": full}
    params_path = tmp_path / "tiny.yaml"
    params_path.write_text(yaml.safe_dump(params))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [
        *STARTED_GPTPIPE, "train", "--params", str(params_path), "--device", "cpu",  # held with SIGSTOP
        "--precision", "fp32", "--synthetic", "--checkpoint-directory", str(tmp_path / "ckpt"),
        "--max-steps", "100", "--log-every", "1", "--eval-every", "50",
    ]  # fmt: skip
    training = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    first = json.loads(training.stdout.readline())
    assert first["event"] == "startup"
    training.send_signal(signal.SIGSTOP)  # held still while the server goes, however fast each side is
    server.stop()  # just after the startup line, as the issue measured it
    training.send_signal(signal.SIGCONT)
    out, err = training.communicate(timeout=300)
    assert training.returncode == 0, err
    assert "Traceback" not in err
    summary = json.loads(out.strip().splitlines()[-1])
    steps = summary["steps"]
    assert summary["event"] == "summary" and steps == 100
    (warning,) = [line for line in err.splitlines() if "records wait in" in line]
    outbox = Path(warning.split("records wait in ")[1].split(":")[0])
    waiting = int(warning.split("; ")[-1].split(" records")[0])
    assert outbox.is_file() and waiting >= steps

    server.start()  # the same port, the same store
    replay = subprocess.run(
        [*FORKED_GPTPIPE, "tracking", "replay", str(outbox)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    sent = int(replay.stdout.split("sent ")[1].split(" records")[0])
    skipped = "2 skipped (log_model: logged model best: the checkpoint names no tokenizer"  # --synthetic
    assert sent == waiting - 2 and skipped in replay.stdout
    assert not outbox.exists()
    session = TrackingSession.open(TrackingConfig(experiment="gptpipe"))
    runs = session.client.search_runs([session.experiment_id])
    assert len(runs) == 1, [(r.info.run_name, r.info.status, r.data.tags) for r in runs]  # which, if not
    (run,) = runs
    assert run.info.status == "FINISHED"
    history = session.client.get_metric_history(run.info.run_id, "train_loss")
    assert [m.step for m in history] == list(range(1, steps + 1))  # no gap, in order
