"""MLflow tracking: where records go, what a training run records, failures survived, parents and children."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tracking_support import fresh_store, three_step_job
from waiting import until

from gptcore.train.records import (
    END_METRICS,
    STEP_METRICS,
    EvalRecord,
    StartupRecord,
    StepRecord,
    SummaryRecord,
)
from tasks.params.schema import TrackingConfig
from tasks.results import StageResult
from tasks.tracking import DeliverySettings, PipelineRecorder, RunWriter, TrackingSession, training_metadata
from tasks.tracking.callback import MLflowCallback
from tasks.tracking.delivery.outbox import Outbox
from tasks.tracking.delivery.report import WriterReport
from tasks.tracking.session import run_label
from tasks.tracking.store import TrackingError, connect, environment_tags, redact, resolve_target

STARTUP_FIELDS = {
    "event": "startup",
    "processor": "x86_64",
    "gpu_name": None,
    "gpu_memory_bytes": 0,
    "torch_version": "2.13.0",
    "cuda_available": False,
    "device": "cpu",
    "precision": "fp32",
    "tensor_cores_enabled": False,
    "tf32_enabled": False,
    "fused_adamw": True,
    "batch_size": 4,
    "grad_accum_steps": 2,
    "workers": 0,
    "sequence_length": 16,
    "parameter_count": 12345,
    "max_steps": 4,
    "planned_tokens": 512,
    "estimated_peak_memory_bytes": 1000,
    "checkpoint_directory": "/tmp/nowhere",
    "start_step": 0,
    "resumed_from": None,
}


def startup(**changes: Any) -> StartupRecord:
    """The trainer's start-up record of a small CPU run, with `changes`."""
    return StartupRecord.from_dict({**STARTUP_FIELDS, **changes})


REQUIRED_PARAMS = [
    "processor",
    "gpu_name",
    "gpu_memory_bytes",
    "torch_version",
    "cuda_available",
    "device",
    "precision",
    "tensor_cores_enabled",
    "tf32_enabled",
    "fused_adamw",
    "batch_size",
    "grad_accum_steps",
    "effective_batch_size",
    "workers",
    "sequence_length",
    "parameter_count",
    "max_steps",
    "planned_tokens",
]


@pytest.fixture(autouse=True)
def no_ambient_tracking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture
def session(tmp_path: Path) -> TrackingSession:
    uri = fresh_store(tmp_path)
    config = TrackingConfig(uri=uri, artifact_root=str(tmp_path / "mlruns" / "artifacts"), experiment="t")
    return TrackingSession.open(config)


def step(n: int, loss: float) -> StepRecord:
    return StepRecord.from_dict(
        {
            "step": n,
            "train_loss": loss,
            "learning_rate": 1e-3,
            "grad_norm": 0.5,
            "tokens_per_second": 900.0,
            "steps_per_second": 2.0,
            "mfu": 0.1,
            "load_average": 1.2,
            "other_cpu_cores": 0.05,
            "epoch": 0,
        }
    )


def fake_checkpoint(folder: Path, name: str, metadata: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.pt"
    path.write_bytes(b"weights of " + name.encode())
    kind = name if name in ("best", "final") else "step"  # what every checkpoint record names
    (folder / f"{name}.json").write_text(json.dumps({"kind": kind, "metadata": dict(metadata), "step": 4}))
    return path


def history(session: TrackingSession, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in session.client.get_metric_history(run_id, key)]


# --- store ------------------------------------------------------------------------------------------


def test_default_store_is_sqlite_under_mlruns_of_the_working_directory(tmp_path: Path) -> None:
    target = resolve_target(TrackingConfig(), root=tmp_path)
    assert target.uri == f"sqlite:///{tmp_path.resolve()}/mlruns/mlflow.db"
    assert target.artifact_location == (tmp_path / "mlruns" / "artifacts").resolve().as_uri()
    assert target.source == "default"


def test_a_local_stores_artifacts_lie_beside_it_whatever_the_working_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/store/mlflow.db")
    target = resolve_target(TrackingConfig(), root=tmp_path / "elsewhere")
    assert target.artifact_location == (tmp_path / "store" / "artifacts").resolve().as_uri()
    named = resolve_target(TrackingConfig(artifact_root="art"), root=tmp_path / "elsewhere")
    assert named.artifact_location == (tmp_path / "elsewhere" / "art").resolve().as_uri()  # as it says


def test_environment_uri_wins_over_the_parameter_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    target = resolve_target(TrackingConfig(uri="sqlite:///elsewhere.db"), root=tmp_path)
    assert (target.uri, target.source, target.artifact_location) == (
        "http://127.0.0.1:5999",
        "MLFLOW_TRACKING_URI",
        None,
    )


def test_the_old_file_store_is_refused_with_what_to_use(tmp_path: Path) -> None:
    with pytest.raises(TrackingError, match=r"tracking.uri './mlruns'.*sqlite:///"):
        resolve_target(TrackingConfig(uri="./mlruns"), root=tmp_path)


def test_opening_a_store_again_in_one_process_finds_the_same_experiment_quickly(tmp_path: Path) -> None:
    config = TrackingConfig(
        uri=fresh_store(tmp_path),
        artifact_root=str(tmp_path / "art"),
        experiment="again",
        system_metrics=False,
    )
    first = TrackingSession.open(config)  # what `gptpipe run` does while Prefect's server starts
    second = TrackingSession.open(config)  # the flow's own open: MLflow kept the store
    # One store object: its engine connected, migrated and checked once (a new one takes seconds).
    assert second.client._tracking_client.store is first.client._tracking_client.store
    assert second is not first and second.experiment_id == first.experiment_id
    assert second.system_metrics is False
    another = TrackingSession.open(config.model_copy(update={"experiment": "another"}))
    assert another.experiment_name == "another"


def test_experiments_are_model_training_and_gptpipe_ui_opens_on_their_runs_table(tmp_path: Path) -> None:
    from flows.cli.tracking import runs_page

    base, config = "http://127.0.0.1:5000", TrackingConfig(uri=f"sqlite:///{tmp_path / 'none' / 'mlflow.db'}")
    home = f"{base}/gptpipe/training-view"  # the UI's home, through the page that keeps the training view
    assert runs_page(resolve_target(config), "gptpipe-iteration-1", base) == home, "no store: the home page"
    assert not (tmp_path / "none").exists(), "looking did not create a store"

    config = TrackingConfig(uri=fresh_store(tmp_path), experiment="gptpipe-iteration-1")
    target = resolve_target(config)
    assert runs_page(target, "gptpipe-iteration-1", base) == home, "no runs recorded yet: the home page"
    session = TrackingSession.open(config)
    page = runs_page(target, "gptpipe-iteration-1", base)
    assert page == f"{home}#/experiments/{session.experiment_id}/runs?workflowType=machine_learning"
    run = session.client.create_run(session.experiment_id).info.run_id
    route = f"/experiments/{session.experiment_id}/runs/{run}"
    assert session.run_url(run) == f"{home}#{route}?workflowType=machine_learning", "a training run's page"
    kind = session.client.get_experiment(session.experiment_id).tags["mlflow.experimentKind"]
    assert kind == "custom_model_development", "MLflow's UI opens it as model training, not GenAI"

    older = session.client.create_experiment("made-by-an-older-gptpipe")  # no kind
    TrackingSession.open(config.model_copy(update={"experiment": "made-by-an-older-gptpipe"}))
    assert session.client.get_experiment(older).tags["mlflow.experimentKind"] == "custom_model_development"
    session.client.set_experiment_tag(older, "mlflow.experimentKind", "genai_development")  # on purpose
    TrackingSession.open(config.model_copy(update={"experiment": "made-by-an-older-gptpipe"}))
    assert session.client.get_experiment(older).tags["mlflow.experimentKind"] == "genai_development"


def test_open_refuses_a_store_that_cannot_be_used(tmp_path: Path) -> None:
    with pytest.raises(TrackingError, match="sqlite:///"):
        TrackingSession.open(TrackingConfig(uri="./mlruns"), root=tmp_path)


def test_an_unreachable_server_is_a_clear_error_at_the_first_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    """One probe, no retries with back-off (which would take minutes): counted, not timed."""
    import urllib.request

    probes: list[str] = []
    urlopen = urllib.request.urlopen
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, **kw: probes.append(url) or urlopen(url, **kw))
    with socket.socket() as bound:  # bound and never listening: refused, and no other process can take it
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        with pytest.raises(TrackingError, match=rf"tracking server http://127.0.0.1:{port} is unreachable"):
            connect(resolve_target(TrackingConfig(uri=f"http://127.0.0.1:{port}")))
    assert probes == [f"http://127.0.0.1:{port}/health"]


def test_secret_environment_values_never_reach_a_record(monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {
        "HF_TOKEN": "hf_abcdef123",
        "AWS_SECRET_ACCESS_KEY": "s3cr3tvalue",
        "CUDA_VISIBLE_DEVICES": "0",
    }
    assert redact("login hf_abcdef123 and s3cr3tvalue", environ) == "login *** and ***"
    assert redact("http://me:pw1234@host:5000/x", {}) == "http://me:***@host:5000/x"
    environ["MY_API_KEY_HOSTNAME"] = "nope"
    assert environment_tags(environ) == {"env.CUDA_VISIBLE_DEVICES": "0"}


def test_a_url_password_is_redacted_wherever_it_stands_in_a_text() -> None:
    """MLflow's errors name the URL they called, inside a sentence."""
    error = (
        "API request to http://alice:hunter22@mlflow.team.lan:5000/api/2.0/runs failed; retry https://b:x@h"
    )
    assert redact(error, {}) == (
        "API request to http://alice:***@mlflow.team.lan:5000/api/2.0/runs failed; retry https://b:***@h"
    )
    report = WriterReport()
    report.count(last_error=error)
    assert "hunter22" not in report.last_error and report.last_error.startswith(
        "API request to http://alice:***@"
    )


def test_the_commit_tag_is_the_checkouts_head_and_absent_outside_git(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    from tasks.tracking.store import git_commit

    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # git looks no higher, wherever tmp is

    def git(*args: str) -> str:
        command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path / "repo"), *args]
        return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()

    (tmp_path / "repo").mkdir()
    git("init", "-q")
    git("commit", "-q", "--allow-empty", "-m", "first")
    assert git_commit(tmp_path / "repo") == git("rev-parse", "HEAD")
    (tmp_path / "plain").mkdir()
    assert git_commit(tmp_path / "plain") is None  # a copy without .git: no tag rather than a wrong one


def test_a_failed_runs_tags_and_resume_command_hold_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    from flows import failure_hooks

    monkeypatch.setattr(failure_hooks, "_latest_checkpoint", lambda *args: None)
    overrides = ["tracking.uri=http://alice:hunter22@mlflow.lan:5000", "tracking.api_key=abc123",
                 "evaluate.max_tokens=65536"]  # fmt: skip
    failure = failure_hooks.describe_failure(
        {"params_path": "p.yaml", "overrides": overrides},
        "full-123",
        "Flow run encountered an exception: TrackingError: API request to http://alice:hunter22@mlflow.lan:5000/x",
        "Failed",
    )
    shown = " ".join([*failure.tags().values(), failure.markdown()])
    assert "hunter22" not in shown and "abc123" not in shown
    assert "tracking.api_key=***" in failure.resume and "evaluate.max_tokens=65536" in failure.resume
    assert failure.reason == "API request to http://alice:***@mlflow.lan:5000/x"


# --- the training callback ---------------------------------------------------------------------------


def test_a_training_run_records_the_issue_names_checkpoints_and_the_run_id(
    session: TrackingSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "key-that-must-not-leak")
    callback = session.training_callback(
        "train",
        params={"model.profile": "tiny", "note": "key-that-must-not-leak"},
        system_metrics=False,
        delivery=DeliverySettings(flush_seconds=0.05),
    )
    callback.on_start(startup())
    run_id = callback.run_id
    assert training_metadata([object(), callback])["mlflow_run_id"] == run_id
    for n, loss in ((2, 5.0), (4, 4.0)):
        callback.on_step(step(n, loss))
    callback.on_eval(
        EvalRecord.from_dict({"step": 4, "val_loss": 4.2, "val_perplexity": 66.7, "unigram_val_loss": 5.6})
    )
    folder = tmp_path / "ckpt"
    for kind in ("step", "best", "final"):
        path = fake_checkpoint(folder, kind, callback.metadata)
        callback.on_checkpoint(path, {"kind": kind, "step": 4, "seconds": 0.01})
    summary = {name: 1.5 for name in END_METRICS} | {"steps": 4, "steady_steps_seconds": None}
    callback.on_end(SummaryRecord.from_dict(summary))

    run = session.client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert set(REQUIRED_PARAMS) <= set(run.data.params)
    assert run.data.params["effective_batch_size"] == "8"
    assert run.data.params["note"] == "***"
    assert history(session, run_id, "train_loss") == [(2, 5.0), (4, 4.0)]
    assert set(STEP_METRICS) | {"val_loss", "val_perplexity", "unigram_val_loss"} <= set(run.data.metrics)
    assert "steady_steps_seconds" not in run.data.metrics  # None is not a number to plot
    assert run.data.metrics["peak_memory_bytes"] == 1.5
    assert run.data.tags["latest_checkpoint"] == str((folder / "final.pt").resolve())
    logged = {
        a.path
        for folder_ in ("checkpoints/final", "checkpoints/best")
        for a in session.client.list_artifacts(run_id, folder_)
    }
    assert logged == {
        "checkpoints/final/final.pt",
        "checkpoints/final/final.json",
        "checkpoints/best/best.pt",
        "checkpoints/best/best.json",
    }
    assert callback.report["failed_calls"] == 0


def test_a_training_run_declares_its_token_files_as_datasets_from_their_manifests(
    session: TrackingSession, tmp_path: Path
) -> None:
    import numpy as np

    from gptcore.data.tokenfile import TokenFileManifest, write_manifest
    from gptcore.tools.fingerprint import sha256_file

    train_file, bare = tmp_path / "train.bin", tmp_path / "validation.bin"
    for path in (train_file, bare):
        np.arange(64, dtype="<u2").tofile(path)
    manifest = TokenFileManifest(
        dtype="uint16",
        token_count=64,
        document_count=3,
        vocab_size=300,
        tokenizer_sha256="ab" * 32,
        corpus_fingerprint="corpus-fp",
        split="train",
        sha256=sha256_file(train_file),
        text_bytes=200,
    )
    write_manifest(train_file, manifest)
    callback = session.training_callback(
        "data", system_metrics=False, datasets={"train": train_file, "validation": bare, "test": None}
    )
    callback.on_start(startup())
    callback.on_end(SummaryRecord.from_dict({"steps": 0}))
    inputs = session.client.get_run(callback.run_id).inputs.dataset_inputs
    assert len(inputs) == 1  # the bare stream has no manifest to declare
    dataset = inputs[0].dataset
    assert (dataset.name, dataset.digest) == ("tokens-train", manifest.sha256[:16])
    assert json.loads(dataset.profile) == {
        "tokens": 64,
        "documents": 3,
        "text_bytes": 200,
        "tokenizer_sha256": "ab" * 32,
        "corpus_fingerprint": "corpus-fp",
    }
    assert {(tag.key, tag.value) for tag in inputs[0].tags} == {("mlflow.data.context", "training")}


class FlakyClient:
    """An MlflowClient whose metric batches fail a number of times (or always) before going through."""

    def __init__(self, client: Any, failures: int) -> None:
        self._client, self.failures = client, failures

    def log_batch(self, run_id: str, metrics: Any = (), **kwargs: Any) -> None:
        if metrics and self.failures:
            self.failures -= 1
            raise ConnectionError("tracking server went away")
        self._client.log_batch(run_id, metrics=metrics, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def flaky_callback(session: TrackingSession, failures: int = 0, client: Any = None) -> MLflowCallback:
    return MLflowCallback(
        client or FlakyClient(session.client, failures),
        session.target.uri,
        session.experiment_id,
        "flaky",
        system_metrics=False,
        delivery=DeliverySettings(flush_seconds=0.05, backoff_seconds=0.01),
        outbox=session.outbox,
    )


def test_failed_logging_calls_are_retried_counted_and_training_never_sees_them(
    session: TrackingSession, capsys: pytest.CaptureFixture[str]
) -> None:
    callback = flaky_callback(session, failures=2)
    callback.on_start(startup())
    callback.on_step(step(1, 3.0))
    callback.on_end(SummaryRecord.from_dict({"steps": 1}))
    assert callback.report["failed_calls"] == 2 and callback.report["dropped_metrics"] == 0
    assert history(session, callback.run_id, "train_loss") == [(1, 3.0)]
    assert session.client.get_run(callback.run_id).data.tags["tracking.failed_calls"] == "2"
    assert "2 logging calls failed and were retried" in capsys.readouterr().err


def test_a_store_that_stays_down_leaves_the_records_in_an_outbox_that_replay_delivers(
    session: TrackingSession, capsys: pytest.CaptureFixture[str]
) -> None:
    callback = flaky_callback(session, failures=10**6)
    callback.on_start(startup())
    for n in range(1, 4):
        callback.on_step(step(n, 3.0))
    callback.on_end(SummaryRecord.from_dict({"steps": 3}))
    report = callback.report
    assert report["store_down"] and report["dropped_metrics"] == 0 and report["given_up_calls"] == 0
    outbox = Path(report["outbox"])
    assert outbox.parent == session.outbox and report["waiting_records"] >= 3 * len(STEP_METRICS)
    assert f"records wait in {outbox}" in capsys.readouterr().err
    assert session.client.get_run(callback.run_id).info.status == "RUNNING"  # its end waits too

    replayed = RunWriter.replay(session.client, Outbox.open(outbox))
    assert (replayed.waiting_records, replayed.given_up_calls) == (0, 0) and not outbox.exists()
    assert history(session, callback.run_id, "train_loss") == [(1, 3.0), (2, 3.0), (3, 3.0)]
    assert session.client.get_run(callback.run_id).info.status == "FINISHED"


class GoneClient(FlakyClient):
    """An MlflowClient whose every batch fails: the store is away for params and tags as for metrics."""

    def __init__(self, client: Any) -> None:
        super().__init__(client, failures=0)

    def log_batch(self, run_id: str, metrics: Any = (), **kwargs: Any) -> None:
        raise ConnectionError("tracking server went away")


def test_the_outbox_of_a_run_holds_no_credential(
    session: TrackingSession, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    secrets = {"MLFLOW_TRACKING_PASSWORD": "mlflow-pass-4f1c", "PREFECT_API_AUTH_STRING": "admin:pf-9b2e"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PREFECT_API_URL", "http://admin:url-pass-77aa@prefect.team.lan:4200/api")  # a tag
    callback = flaky_callback(session, client=GoneClient(session.client))  # everything goes to the outbox
    secret_path = "/runs/mlflow-pass-4f1c/admin:pf-9b2e"  # even in a param
    callback.on_start(startup(checkpoint_directory=secret_path))
    callback.on_step(step(1, 3.0))
    callback.on_end(SummaryRecord.from_dict({"steps": 1}))
    text = Path(callback.report["outbox"]).read_text()
    assert '"/runs/***/***"' in text  # the param waits in the outbox, its secret part redacted
    for secret in (*secrets.values(), "pf-9b2e", "url-pass-77aa"):
        assert secret not in text


def test_a_failed_training_ends_its_run_failed_with_the_reason(session: TrackingSession) -> None:
    callback = session.training_callback("broken", system_metrics=False)
    callback.on_start(startup())
    callback.on_failure("training loss is nan at step 3; stopped")
    run = session.client.get_run(callback.run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["failure_reason"] == "training loss is nan at step 3; stopped"


def test_system_metrics_are_recorded_while_training_runs(
    session: TrackingSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    callback = session.training_callback("system", delivery=DeliverySettings(flush_seconds=0.05))
    callback.on_start(startup())
    sampled = "system/cpu_utilization_percentage"
    until(lambda: sampled in session.client.get_run(callback.run_id).data.metrics, "a system sample logged")
    callback.on_end(SummaryRecord.from_dict({"steps": 0}))
    metrics = session.client.get_run(callback.run_id).data.metrics
    assert "system/system_memory_usage_megabytes" in metrics


def test_a_resume_continues_the_run_named_in_its_checkpoint(session: TrackingSession, tmp_path: Path) -> None:
    first = session.training_callback(
        "train", system_metrics=False, delivery=DeliverySettings(flush_seconds=0.05)
    )
    first.on_start(startup())
    first.on_step(step(2, 5.0))
    checkpoint = fake_checkpoint(tmp_path / "ckpt", "step-00000002", first.metadata)
    first.on_failure("interrupted")

    second = session.training_callback(
        "train", system_metrics=False, delivery=DeliverySettings(flush_seconds=0.05)
    )
    second.on_start(startup(start_step=2, resumed_from=str(checkpoint), batch_size=2, grad_accum_steps=4))
    second.on_step(step(4, 4.0))
    second.on_end(SummaryRecord.from_dict({"steps": 4}))
    assert second.run_id == first.run_id and second.continued
    run = session.client.get_run(first.run_id)
    assert run.info.status == "FINISHED"
    assert history(session, first.run_id, "train_loss") == [(2, 5.0), (4, 4.0)]
    assert run.data.params["batch_size"] == "4"  # params keep the first value; a resume adds, never clashes


# --- pipeline parent and child runs --------------------------------------------------------------------


def pipeline_params(tmp_path: Path) -> tuple[Any, Path]:
    from tasks.params.loading import load_params

    path = tmp_path / "iteration.yaml"
    path.write_text(
        "iteration: 7\nmodel:\n  name: tiny\n  architecture: {n_layer: 1, n_head: 1, n_embd: 8, "
        "block_size: 8, vocab_size: 300}\n  cpu: {batch_size: 2}\n  gpu: {batch_size: 2}\n"
        "tokenizer: {vocab_size: 300}\n"
        f"tracking:\n  uri: {fresh_store(tmp_path)}\n  artifact_root: {tmp_path / 'art'}\n"
        "  experiment: it-7\n"
    )
    return load_params(path), path


def test_a_flow_run_is_a_parent_with_one_child_per_stage_and_cached_children_point_at_their_producer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    params, path = pipeline_params(tmp_path)
    commit = "0123456789abcdef" * 2 + "01234567"  # the checkout's commit, as git_commit gives it
    monkeypatch.setattr("tasks.tracking.recorder.git_commit", lambda: commit)
    manifest_file = tmp_path / "tokenizer.json"
    manifest_file.write_text("{}")
    result = StageResult(fingerprint="abc123", files={str(manifest_file): "x"}, figures={"vocab_size": 300})

    first = PipelineRecorder.start(params, path, flow_run_id="flow-1")
    producer = first.record_stage(
        SimpleNamespace(name="tokenizer", state="completed", result=result, seconds=1.0, message="")
    )
    first.finish(failed=False)
    second = PipelineRecorder.start(params, path, flow_run_id="flow-2")
    cached = second.record_stage(
        SimpleNamespace(name="tokenizer", state="cached", result=result, seconds=0.1, message="")
    )
    second.finish(failed=False)

    client = first.session.client
    parent = client.get_run(second.parent_run_id)
    assert parent.info.experiment_id == client.get_experiment_by_name("it-7").experiment_id
    assert parent.data.tags["prefect.flow_run_id"] == "flow-2"
    assert len(parent.data.tags["params_sha256"]) == 64
    assert (parent.data.tags["git_commit"], parent.data.tags["mlflow.source.git.commit"]) == (commit, commit)
    assert parent.data.params["model.profile"] == "tiny"
    # The recipe a run trained with is two params of the parent run, so the compare view sets them apart.
    assert (parent.data.params["model.recipe"], parent.data.params["optimizer.name"]) == ("gpt2", "adamw")
    child = client.get_run(cached)
    assert child.data.tags["mlflow.parentRunId"] == second.parent_run_id
    assert (child.data.tags["cached"], child.data.tags["cached_from_run_id"]) == ("true", producer)
    assert client.get_run(producer).data.tags["cached"] == "false"
    assert {a.path for a in client.list_artifacts(producer, "outputs")} == {"outputs/tokenizer.json"}
    assert parent.info.status == "FINISHED"
    # Named for what a person compares: the iteration, the file (not iteration_7.yaml), the settings.
    assert re.fullmatch(r"iteration-7-iteration-[0-9a-f]{8}", parent.info.run_name)
    assert child.info.run_name == f"tokenizer-{parent.info.run_name}"
    other = params.model_copy(update={"full": params.full.model_copy(update={"max_steps": 3})})
    assert run_label(other, path) != parent.info.run_name, "other settings: another name"
    assert run_label(params, tmp_path / "iteration_7.yaml").startswith("iteration-7-") and (
        "iteration_7" not in run_label(params, tmp_path / "iteration_7.yaml")
    ), "the iteration said once"


def test_a_pipeline_training_stage_records_into_its_child_run(tmp_path: Path) -> None:
    from gptcore.train.trainer import train

    params, path = pipeline_params(tmp_path)
    recorder = PipelineRecorder.start(params, path)
    callbacks = recorder.training_callbacks("smoke", params.model)
    train(three_step_job(tmp_path / "ckpt", training_metadata(callbacks)), callbacks[0])
    run_id = recorder.record_stage(
        SimpleNamespace(
            name="smoke", state="completed", result=StageResult(fingerprint="f"), seconds=1.0, message=""
        )
    )
    recorder.finish(failed=False)
    assert run_id == callbacks[0].run_id
    run = recorder.session.client.get_run(run_id)
    assert run.data.tags["mlflow.parentRunId"] == recorder.parent_run_id
    assert [s for s, _ in history(recorder.session, run_id, "train_loss")] == [1, 2, 3]
    assert {"val_loss", "unigram_val_loss", "elapsed_seconds", "tokens_per_second"} <= set(run.data.metrics)
    from gptcore.checkpoint.files import checkpoint_metadata

    assert checkpoint_metadata(tmp_path / "ckpt" / "final.pt").metadata["mlflow_run_id"] == run_id


# --- `gptpipe train` --------------------------------------------------------------------------------


def train_args(params_file: Path, directory: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--params",
        str(params_file),
        "--synthetic",
        "--device",
        "cpu",
        "--max-steps",
        "4",
        "--training-examples",
        "32",
        "--validation-examples",
        "8",
        "--log-every",
        "1",
        "--checkpoint-every",
        "2",
        "--checkpoint-directory",
        str(directory),
        *extra,
    ]


def test_gptpipe_train_records_its_run_and_a_resume_continues_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli.main import main
    from gptcore.checkpoint.files import checkpoint_metadata

    params, path = pipeline_params(tmp_path)
    directory = tmp_path / "run"
    assert main(train_args(path, directory)) == 0
    run_id = checkpoint_metadata(directory / "final.pt").metadata["mlflow_run_id"]
    session = TrackingSession.open(params.tracking)
    run = session.client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert re.fullmatch(rf"full-iteration-{params.iteration}-iteration-[0-9a-f]{{8}}", run.info.run_name), (
        "the stage, the iteration, the parameter file (not the iteration's own), the settings' fingerprint"
    )
    assert [a.path for a in session.client.list_artifacts(run_id, "inputs")] == ["inputs/iteration.yaml"]
    assert run.data.params["model.profile"] == "tiny"
    assert run.data.params["optimizer.learning_rate"] == str(params.full.optimizer.learning_rate)
    assert main(train_args(path, directory, "--resume")) == 0  # resumes from final: nothing left to train
    assert checkpoint_metadata(directory / "final.pt").metadata["mlflow_run_id"] == run_id
    assert len(session.client.search_runs([session.experiment_id])) == 1
    capsys.readouterr()


def test_gptpipe_train_stops_before_training_when_the_tracking_server_is_unreachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli.main import main

    _, path = pipeline_params(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # discard port: nothing answers
    directory = tmp_path / "run"
    assert main(train_args(path, directory)) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("error: tracking server http://127.0.0.1:9 is unreachable")
    assert '"event": "startup"' not in captured.out and not directory.exists()
    assert main([*train_args(path, directory), "--no-track"]) == 0  # the opt-out trains without MLflow


@pytest.mark.slow
def test_processes_opening_a_new_sqlite_store_at_once_all_open_it(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    opener = "from tasks.tracking.store import connect, resolve_target; connect(resolve_target(None))"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"}
    openers = [
        subprocess.Popen([sys.executable, "-c", opener], env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]  # each would create and migrate the tables; together they collided ("duplicate column name")
    errors = [opener.communicate(timeout=300)[1] for opener in openers]
    assert [opener.returncode for opener in openers] == [0, 0, 0, 0], errors
