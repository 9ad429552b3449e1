"""The comparison: two bounded runs differing in one axis, compared from their MLflow record, or refused."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from tracking_support import fresh_store

from flows.cli.main import main
from flows.compare import compare, compare_runs
from gptcore.errors import ConfigError
from gptcore.eval.comparison import Limits, NotComparable, choose_axis, differing_controls
from tasks.params.loading import load_params
from tasks.params.schema import TrackingConfig
from tasks.tracking import TrackingSession

TINY = "{n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, vocab_size: 300}"


@pytest.fixture(autouse=True)
def no_ambient_tracking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture
def params_file(tmp_path: Path) -> Path:
    path = tmp_path / "compare.yaml"
    path.write_text(
        f"iteration: 1\nmodel:\n  name: tiny\n  architecture: {TINY}\n  cpu: {{batch_size: 2}}\n"
        f"  gpu: {{batch_size: 2}}\ntokenizer: {{vocab_size: 300}}\n"
        f"tracking:\n  uri: {fresh_store(tmp_path)}\n"
        f"  artifact_root: {tmp_path / 'artifacts'}\n  experiment: compare-test\n"
    )
    return path


def session_of(params_file: Path) -> TrackingSession:
    return TrackingSession.open(load_params(params_file).tracking)


def test_without_a_gpu_auto_compares_precisions_and_device_is_refused() -> None:
    assert choose_axis("auto", None, cuda_available=False, batch_size=4) == ("precision", ["fp32", "bf16"])
    assert choose_axis("auto", None, cuda_available=True, batch_size=4) == ("device", ["cpu", "cuda"])
    assert choose_axis("batch_size", None, cuda_available=False, batch_size=4) == ("batch_size", ["4", "8"])
    with pytest.raises(ConfigError, match="CUDA is not available"):
        choose_axis("device", None, cuda_available=False, batch_size=4)
    with pytest.raises(ConfigError, match="two different values"):
        choose_axis("precision", ["fp32", "fp32"], cuda_available=False, batch_size=4)


def test_controls_other_than_the_axis_must_match() -> None:
    first = {"precision": "fp32", "batch_size": "4", "device": "cpu", "data.train_tokens": "a"}
    assert differing_controls(first, {**first, "precision": "bf16"}, "precision") == []
    assert differing_controls(first, {**first, "precision": "bf16", "batch_size": "8"}, "precision") == [
        "batch_size: '4' != '8'"
    ]


def test_the_compare_flow_trains_both_sides_and_logs_the_table(
    params_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = compare.fn(
        params_path=str(params_file), axis="precision", values=["fp32", "bf16"], max_steps=3,
        training_examples=8, validation_examples=4,
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "| tokens_per_second |" in out and "fp32 (" in out and "bf16 (" in out
    assert json.loads(out.strip().splitlines()[-1])["axis"] == "precision"
    session = session_of(params_file)
    parent = session.client.get_run(result["parent_run_id"])
    assert parent.info.status == "FINISHED"
    children = [session.client.get_run(run_id) for run_id in result["run_ids"]]
    assert [c.data.params["precision"] for c in children] == ["fp32", "bf16"]
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    assert all(
        c.data.params["batch_size"] == "2" and c.data.params["train_examples"] == "8" for c in children
    )
    assert {a.path for a in session.client.list_artifacts(parent.info.run_id)} >= {
        "comparison.md",
        "comparison.json",
        "inference.json",
    }
    # A precision comparison's inference rows: the fp32 side's model in each precision, the same windows.
    rows = result["inference"]["rows"]
    assert [row["method"] for row in rows] == [
        "fp32", "bf16", "int8-weight-only", "int8-dynamic", "int4-weight-only"
    ]  # fmt: skip
    measured = [row for row in rows if row["status"] == "ok"]
    assert len({row["test_tokens"] for row in measured}) == 1 and rows[1]["size_ratio"] < 0.6
    skipped = [row["status"] for row in rows if row["status"] != "ok"]
    assert all("no group size of 128, 64, 32 divides" in status for status in skipped), skipped
    assert "The fp32 side's model in each precision" in out
    assert re.search(r"\| int8-dynamic( \(emulated\))? \|", out)  # emulated on a CPU without VNNI or AMX


def logged_run(session: TrackingSession, params: dict[str, Any], tokens_per_second: float) -> str:
    from mlflow.entities import Metric, Param

    run_id = session.client.create_run(session.experiment_id).info.run_id
    session.client.log_batch(
        run_id,
        metrics=[Metric("tokens_per_second", tokens_per_second, 0, 1)],
        params=[Param(k, str(v)) for k, v in params.items()],
    )
    return run_id


def test_runs_whose_controls_differ_are_refused_naming_the_controls(tmp_path: Path) -> None:
    config = TrackingConfig(uri=fresh_store(tmp_path), artifact_root=str(tmp_path / "art"), experiment="x")
    session = TrackingSession.open(config)
    base = {"device": "cpu", "precision": "fp32", "batch_size": 4, "max_steps": 10, "data.train_tokens": "t"}
    a = logged_run(session, base, 1000.0)
    b = logged_run(session, {**base, "precision": "bf16"}, 1500.0)
    c = logged_run(session, {**base, "precision": "bf16", "batch_size": 8, "max_steps": 20}, 1500.0)
    assert (
        "| tokens_per_second | 1,000 | 1,500 | 1.5 |" in compare_runs(session, [a, b], "precision")["table"]
    )
    with pytest.raises(
        NotComparable, match=r"controls differ: batch_size: '4' != '8'; max_steps: '10' != '20'"
    ):
        compare_runs(session, [a, c], "precision")


def test_cli_compares_recorded_runs_and_refuses_bad_axes(
    params_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session = session_of(params_file)
    a = logged_run(session, {"device": "cpu", "batch_size": 4}, 10.0)
    b = logged_run(session, {"device": "cpu", "batch_size": 8}, 30.0)
    assert main(["compare", "--params", str(params_file), "--axis", "batch_size", "--runs", f"{a},{b}"]) == 0
    assert "| tokens_per_second | 10 | 30 | 3 |" in capsys.readouterr().out
    assert main(["compare", "--params", str(params_file), "--axis", "precision", "--runs", f"{a},{b}"]) == 1
    assert main(["compare", "--params", str(params_file), "--axis", "colour"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors[0].startswith("error: runs") and "batch_size: '4' != '8'" in errors[0]
    assert errors[1] == "error: --axis 'colour': expected one of auto, device, precision, batch_size"


def test_limits_default_to_a_bounded_run() -> None:
    assert Limits() == Limits(max_steps=10, training_examples=64, validation_examples=16, epochs=1)


def test_no_track_trains_both_sides_in_process_and_records_nothing(
    params_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["compare", "--params", str(params_file), "--no-track", "--axis", "batch_size", "--values", "2,4"]
    assert main([*args, "--max-steps", "2", "--training-examples", "8", "--validation-examples", "2"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "| figure (batch_size) | 2 | 4 | ratio |"
    summary = json.loads(out[-1])
    assert summary["run_ids"] == [None, None]
    first, second = (run["params"] for run in summary["runs"])
    assert (first["batch_size"], second["batch_size"]) == ("2", "4")
    assert first["train_examples"] == second["train_examples"] == "8" and first["model.n_layer"] == "1"
    assert all(run["metrics"]["tokens_per_second"] > 0 for run in summary["runs"])
    assert session_of(params_file).client.search_runs([session_of(params_file).experiment_id]) == []


def test_no_track_refuses_recorded_runs(params_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["compare", "--params", str(params_file), "--no-track", "--axis", "precision", "--runs", "a,b"])
        == 2
    )
    assert capsys.readouterr().err.startswith("error: --runs reads recorded runs from MLflow")
