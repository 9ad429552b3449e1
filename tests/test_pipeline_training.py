"""Full training inside the pipeline: `batch_size: auto` decided by the smoke stage and reused, a killed
full training resumed from its latest checkpoint, full training on two processes. Each a real `gptpipe
run` on test_pipeline.py's tiny corpus and model: a module of its own, since `make test` hands whole
modules to its workers and test_pipeline.py alone held a fifth of the suite's time."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_pipeline import (
    REPO,
    STARTED_GPTPIPE,
    gptpipe,
    newest_run,
    stages_of,
    states,
    write_corpus,
    write_params,
)
from waiting import until

from gptcore.checkpoint.files import latest_checkpoint


@pytest.mark.slow
def test_batch_size_auto_is_decided_by_the_smoke_stage_and_reused_by_full_training(
    tmp_path: Path, prefect_env: dict[str, str]
) -> None:
    write_corpus(tmp_path, seed=5)
    auto = ["--set", "runtime.batch_size=auto", "--set", "runtime.effective_batch_size=8"]
    result = gptpipe(prefect_env, "--params", str(write_params(tmp_path)), "--until", "full", *auto)
    assert states(result)["full"] == "completed"
    smoke = json.loads(next((tmp_path / "checkpoints").glob("*-smoke-*/smoke.json")).read_text())
    batch = smoke["batch"]
    assert batch["source"] == "estimated" and batch["figures"]["budget_bytes"] > 0
    assert batch["batch_size"] * batch["grad_accum_steps"] == 8  # the effective batch asked for
    sizing, startup = smoke["data_sizing"], newest_run(prefect_env, "smoke").data.params
    expected = (
        smoke["full_planned_steps"] * 8 * int(startup["sequence_length"]) / int(startup["parameter_count"])
    )
    assert sizing["tokens_per_parameter"] == pytest.approx(expected, abs=1e-3)  # recorded to 3 places
    assert (sizing["warning"] is None) == (sizing["train_tokens_per_parameter"] >= 1)
    final = json.loads(next((tmp_path / "checkpoints").glob("*-full-*/final.json")).read_text())
    assert final["config"]["global_batch"] == 8
    full = newest_run(prefect_env, "full").data.params
    assert (full["batch_size"], full["batch_size_source"]) == (str(batch["batch_size"]), "estimated")


@pytest.mark.slow
def test_killed_full_training_resumes_from_its_latest_checkpoint(
    tmp_path: Path, prefect_env: dict[str, str]
) -> None:
    write_corpus(tmp_path, seed=2)
    params = str(write_params(tmp_path, full_steps=400, checkpoint_every=20))
    process = subprocess.Popen(
        [*STARTED_GPTPIPE, "run", "--params", params],  # killed: the process itself, at once
        env=prefect_env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        checkpoint = until(
            lambda: _listed_checkpoint(tmp_path / "checkpoints"), "full training checkpointed", 240
        )
    finally:
        process.kill()
        process.wait()
    killed_at = json.loads(checkpoint.with_suffix(".json").read_text())["step"]

    resumed = gptpipe(prefect_env, "--params", params, "--until", "full")
    full = stages_of(resumed)["full"]
    assert states(resumed)["smoke"] == "cached"
    assert full["state"] == "completed"
    assert 0 < killed_at <= full["figures"]["start_step"] < full["figures"]["planned_steps"]
    assert full["figures"]["steps"] == full["figures"]["planned_steps"]


@pytest.mark.slow
def test_full_training_on_two_processes_records_into_the_stage_run(
    tmp_path: Path, prefect_env: dict[str, str]
) -> None:
    write_corpus(tmp_path, seed=4)
    two = ["--set", "runtime.nproc=2", "--until", "full"]
    result = gptpipe(prefect_env, "--params", str(write_params(tmp_path)), *two, process=True)  # a launcher
    full = stages_of(result)["full"]
    assert full["state"] == "completed" and full["figures"]["steps"] == 12
    record = json.loads(next((tmp_path / "checkpoints").glob("*-full-*/final.json")).read_text())
    assert record["config"]["global_batch"] == 8, "2 ranks of batch 4"
    assert record["metadata"]["mlflow_run_id"], "the launched ranks' checkpoints carry the MLflow run id"


def _listed_checkpoint(checkpoints: Path) -> Path | None:
    """A full run's checkpoint once its manifest lists it: what a resume continues from (its sidecar
    lands a moment before the manifest, and a kill in between leaves it unlisted)."""
    folder = next(checkpoints.glob("*-full-*"), None)
    return latest_checkpoint(folder) if folder else None
