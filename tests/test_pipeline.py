"""The end-to-end pipeline on a tiny corpus and a tiny model: `gptpipe run` as a person runs it (a process
started afresh, at a terminal or not), as a process of its own forked from the suite's fork server where
what the process does is under test, and in the test's process where the run's records are.

The session's Prefect server serves every run (PREFECT_API_URL); each test has its own Prefect home,
result storage and MLflow store in a temporary folder, so the tests never touch the project's
`.prefect/` or the home directory, and no cache crosses tests.
"""

from __future__ import annotations

import json
import random
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import in_process
import pytest
import yaml
from process_support import FORKED_GPTPIPE, STARTED_GPTPIPE

from gptcore.errors import TrainingError
from tasks.params.loading import load_params
from tasks.params.schema import STAGES
from tasks.results import StageResult, file_record
from tasks.stages.smoke_gate import DataSizing, judge

REPO = Path(__file__).resolve().parent.parent
GPTPIPE = FORKED_GPTPIPE  # a process of its own for the command; its imports done by the fork server
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "then",
    "runs",
    "far",
    "into",
    "the",
    "forest",
    "where",
    "birds",
    "sing",
]

TINY_PROFILE = """\
name: tiny
architecture: {n_layer: 1, n_head: 2, n_embd: 32, block_size: 32, vocab_size: 320}
cpu: {batch_size: 4, grad_accum_steps: 1, precision: fp32, workers: 0}
gpu: {batch_size: 4, grad_accum_steps: 1, precision: fp32, workers: 0}
"""


def write_params(root: Path, full_steps: int = 12, checkpoint_every: int = 4) -> Path:
    (root / "profiles").mkdir(parents=True, exist_ok=True)
    (root / "profiles" / "tiny.yaml").write_text(TINY_PROFILE)
    params = f"""\
iteration: 1
model: tiny
corpus: {{source: local, paths: ["{root / "corpus"}"], validation_fraction: 0.2, test_fraction: 0.1}}
tokenizer: {{vocab_size: 300}}
runtime: {{device: cpu}}
smoke: {{max_steps: 6, log_every: 2, eval_every: 6, validation_examples: 8,
        optimizer: {{learning_rate: 3.0e-3, warmup_steps: 1}}}}
full: {{max_steps: {full_steps}, log_every: 2, eval_every: 50, checkpoint_every: {checkpoint_every},
       validation_examples: 8, optimizer: {{learning_rate: 3.0e-3, warmup_steps: 1}}}}
export: {{hf: true}}
quantize: {{methods: [bf16, int8-weight-only], new_tokens: 8, repeats: 1}}
tracking: {{experiment: test-pipeline, artifact_root: "{root / "mlartifacts"}"}}
paths: {{data_root: "{root / "data"}", checkpoint_root: "{root / "checkpoints"}"}}
"""
    path = root / "params.yaml"
    path.write_text(params)
    return path


def write_corpus(root: Path, documents: int = 30, seed: int = 0) -> None:
    folder = root / "corpus"
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for index in range(documents):
        lines = (" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(40))
        (folder / f"doc{index:02d}.txt").write_text("\n".join(lines) + "\n")


def gptpipe(
    env: dict[str, str], *args: str, check: bool = True, process: bool = False, afresh: bool = False
) -> subprocess.CompletedProcess[str]:
    """`gptpipe run ARGS` with `env`: in this process (tests/in_process.py), or with `process` a process
    of its own (forked), where what is under test is the process itself or what it writes (the warnings
    and log lines a run lets through, which pytest would take in-process), or with `afresh` a process
    started as a person's is (its imports' warnings too)."""
    if not (process or afresh):
        result = in_process.gptpipe(env, "run", *args)
    else:
        command = [*(STARTED_GPTPIPE if afresh else GPTPIPE), "run", *args]
        result = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def at_a_terminal(env: dict[str, str], *args: str) -> tuple[str, str]:
    """`gptpipe run` as a person runs it, its stdout a (pseudo-)terminal: what it printed there, and on
    stderr."""
    import os
    import pty

    leader, follower = pty.openpty()
    command = [*STARTED_GPTPIPE, "run", *args]
    with (
        tempfile.TemporaryFile() as stderr,
        subprocess.Popen(command, env=env, cwd=REPO, stdout=follower, stderr=stderr) as process,
    ):
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        stderr.seek(0)
        errors = stderr.read().decode(errors="replace")
        assert process.wait(timeout=300) == 0, errors[-3000:]
    os.close(leader)
    return b"".join(chunks).decode(errors="replace").replace("\r\n", "\n"), errors


def stages_of(result: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert [stage["name"] for stage in record["stages"]] == list(STAGES)
    return {stage["name"]: stage for stage in record["stages"]}


def states(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {name: stage["state"] for name, stage in stages_of(result).items()}


def newest_run(env: dict[str, str], stage: str) -> Any:
    """The newest MLflow run of `stage` in the pipeline's store."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("test-pipeline")
    return client.search_runs(
        [experiment.experiment_id], f"tags.stage = '{stage}'", order_by=["attributes.start_time DESC"]
    )[0]


def datasets_of(env: dict[str, str], stage: str) -> set[tuple[str, str]]:
    """The dataset inputs (name, context) of the newest run of `stage`."""
    return {(i.dataset.name, i.tags[0].value) for i in newest_run(env, stage).inputs.dataset_inputs}


# --- the pipeline, run for real ---------------------------------------------------------------------


@pytest.mark.slow(seconds=50)
def test_runs_then_caches_then_reruns_only_what_changed(tmp_path: Path, prefect_env: dict[str, str]) -> None:
    write_corpus(tmp_path)
    params = str(write_params(tmp_path))

    as_a_person_runs_it = {k: v for k, v in prefect_env.items() if k != "MLFLOW_LOGGING_LEVEL"}
    first = gptpipe(as_a_person_runs_it, "--params", params, afresh=True)
    assert states(first) == dict.fromkeys(STAGES, "completed")
    for noise in (
        "INFO mlflow",
        "Validating input example",
        "system_metrics_monitor",
        "FutureWarning",
        "| ERROR",
    ):
        assert noise not in first.stderr, f"{noise!r} in what a person sees (--verbose shows it)"
    full = stages_of(first)["full"]
    record = json.loads(Path(full["outputs"][0]).with_suffix(".json").read_text())  # final.pt's own
    assert (record["step"], record["val_loss"]) == (12, full["figures"]["final_val_loss"])
    smoke = stages_of(first)["smoke"]["figures"]  # the same recipe for 6 steps, from an untrained ~ln(320)
    assert full["figures"]["final_val_loss"] < smoke["last_val_loss"] < smoke["first_val_loss"] - 0.5
    assert all(Path(path).is_file() for path in full["outputs"])
    assert "tokens/s measured" in first.stderr and "estimated at" in first.stderr
    assert "waiting for" not in first.stderr  # one pipeline's stages hand the device on, nobody waits
    evaluation = stages_of(first)["evaluate"]
    figures = evaluation["figures"]
    # The champion is the full run's final model, and the test split the same random words as validation:
    # its test loss and unigram baseline are the validation's, to the sampling of a few hundred tokens.
    assert figures["step"] == 12
    assert figures["test_loss"] == pytest.approx(full["figures"]["final_val_loss"], abs=0.15)
    assert figures["unigram_test_loss"] == pytest.approx(full["figures"]["unigram_val_loss"], abs=0.15)
    assert figures["test_bits_per_byte"] > 0 and figures["sample"]
    assert [Path(path).name for path in evaluation["outputs"]] == ["evaluation.json", "samples.md"]
    assert "Greedy:" in Path(evaluation["outputs"][1]).read_text()
    assert datasets_of(prefect_env, "full") == {
        ("tokens-train", "training"),
        ("tokens-validation", "validation"),
    }
    assert datasets_of(prefect_env, "evaluate") == {("tokens-test", "test")}
    assert (figures["registered_model"], figures["alias"]) == ("gptpipe-iteration-1", "champion")
    exported = Path(stages_of(first)["export"]["outputs"][0])
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in exported.iterdir()}
    card = yaml.safe_load((exported / "README.md").read_text().split("---")[1])  # the hub's metadata block
    [result] = card["model-index"][0]["results"]
    assert card["model-index"][0]["name"] == "gptpipe-iteration-1" and result["dataset"]["split"] == "test"
    assert result["metrics"][0]["value"] == pytest.approx(figures["test_bits_per_byte"], abs=1e-6)
    assert card["license"] and card["datasets"] and card["library_name"] == "transformers"
    quantized = stages_of(first)["quantize"]["figures"]
    assert quantized["int8-weight-only/size_ratio"] < 1.0 and quantized["bf16/size_ratio"] < 0.6
    assert (quantized["int8-weight-only/alias"], quantized["bf16/alias"]) == ("int8-weight-only", "bf16")
    assert [Path(path).name for path in stages_of(first)["quantize"]["outputs"]] == [
        "tradeoff.json",
        "tradeoff.md",
    ]

    again = gptpipe(prefect_env, "--params", params)
    assert states(again) == {**dict.fromkeys(STAGES, "cached"), "device": "completed"}
    version = stages_of(again)["evaluate"]["figures"]["model_version"]
    assert version == figures["model_version"]  # the same checkpoint: the same version, still champion
    again_quantized = stages_of(again)["quantize"]["figures"]
    assert again_quantized["int8-weight-only/model_version"] == quantized["int8-weight-only/model_version"]

    # At a terminal the run ends in words: where the model is, its test bits per byte, how to look.
    seen, told = at_a_terminal(prefect_env, "--params", params)
    assert '{"stages"' not in seen
    assert "anonymous usage data" not in told  # Prefect's client telemetry is off, as its server's
    assert "Model:     models:/gptpipe-iteration-1@champion (version 1)" in seen
    assert f"Test:      {figures['test_bits_per_byte']:.3f} bits per byte" in seen
    assert f"gptpipe ui --params {params}" in seen and "gptpipe generate --model" in seen
    assert '{"stages"' in at_a_terminal(prefect_env, "--params", params, "--json")[0]

    # A deleted output file: its stage runs again; stages downstream keep their cache (same fingerprint).
    Path(stages_of(again)["tokens"]["outputs"][1]).unlink()
    repaired = gptpipe(prefect_env, "--params", params)
    assert states(repaired) == {
        **dict.fromkeys(STAGES, "cached"),
        "device": "completed",
        "tokens": "completed",
    }
    assert all(Path(path).is_file() for path in stages_of(repaired)["tokens"]["outputs"])

    # One document's content changed: everything downstream of the corpus runs again.
    document = tmp_path / "corpus" / "doc03.txt"
    document.write_text(document.read_text() + "a brand new line about birds\n")
    changed = gptpipe(prefect_env, "--params", params)
    assert states(changed) == dict.fromkeys(STAGES, "completed")


@pytest.mark.slow
def test_until_stops_after_the_named_stage(tmp_path: Path, prefect_env: dict[str, str]) -> None:
    write_corpus(tmp_path, seed=1)
    result = gptpipe(prefect_env, "--params", str(write_params(tmp_path)), "--until", "tokens")
    assert states(result) == {
        "tokenizer": "completed",
        "tokens": "completed",
        "device": "skipped",
        "smoke": "skipped",
        "full": "skipped",
        "evaluate": "skipped",
        "export": "skipped",
        "quantize": "skipped",
    }


class RunsCode:
    """Unpickled, it leaves a file: proof that a cached record ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return Path.touch, (self.marker,)


def test_a_cached_result_gptpipe_did_not_write_as_json_is_ignored_unread(
    tmp_path: Path, prefect_env: dict[str, str]
) -> None:
    """Records are plain JSON, and the run persists nothing else (no flow result as a pickle); a planted
    pickle (Prefect would read a record with the serializer the record names) never runs: it is ignored
    and the stage runs again, its record plain JSON once more (tests/test_security.py: one swapped in)."""
    import base64
    import pickle

    write_corpus(tmp_path, seed=2)
    params = str(write_params(tmp_path))
    gptpipe(prefect_env, "--params", params, "--until", "tokenizer")
    storage = Path(prefect_env["PREFECT_RESULTS_LOCAL_STORAGE_PATH"])
    [record] = storage.glob("tokenizer-*")
    assert [path.name for path in storage.iterdir()] == [record.name], "only the stage's record persists"
    written = json.loads(record.read_text())
    assert written["metadata"]["serializer"]["type"] == "gptpipe-stage-json"
    assert json.loads(written["result"])["fingerprint"] == record.name.removeprefix("tokenizer-")
    marker = tmp_path / "ran-code-from-the-cache"
    planted = {**written, "metadata": {**written["metadata"], "serializer": {"type": "pickle"}}}
    planted["result"] = base64.encodebytes(pickle.dumps(RunsCode(marker))).decode()
    record.write_text(json.dumps(planted))
    again = gptpipe(prefect_env, "--params", params, "--until", "tokenizer", process=True)  # its stderr
    assert not marker.exists()
    assert states(again)["tokenizer"] == "completed", "it ran again instead of trusting the record"
    assert "not gptpipe's plain JSON record; ignored, the stage runs again" in again.stderr
    assert json.loads(record.read_text())["metadata"]["serializer"]["type"] == "gptpipe-stage-json"


@pytest.mark.slow
def test_a_smoke_that_diverges_on_validation_stops_the_pipeline_before_full_training(
    tmp_path: Path, prefect_env: dict[str, str]
) -> None:
    write_corpus(tmp_path, seed=3)
    params = str(write_params(tmp_path))
    absurd = ["--set", "smoke.optimizer.learning_rate=0.5", "--set", "smoke.optimizer.warmup_steps=1"]
    result = gptpipe(prefect_env, "--params", params, *absurd, check=False, process=True)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    assert errors[0].startswith("error: smoke gate failed: ") and "validation loss rose" in errors[0]
    assert "likely cause: the learning rate (peak 0.5) is likely too high" in errors[0]
    assert {k: v for k, v in states(result).items() if k in ("smoke", "full")} == {
        "smoke": "failed",
        "full": "skipped",
    }
    record = json.loads(next((tmp_path / "checkpoints").glob("*-smoke-*/smoke.json")).read_text())
    assert not record["gate"]["passed"] and record["optimizer"]["source"] == "smoke"
    assert record["val_losses"][-1] > record["val_losses"][0]
    # The failure hook: the run's MLflow record says which stage, why, and how to resume.
    from mlflow import MlflowClient

    client = MlflowClient(prefect_env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("test-pipeline").experiment_id
    failed = client.search_runs([experiment], "tags.`failure.stage` = 'smoke'")
    assert len(failed) == 1 and failed[0].data.tags["kind"] == "pipeline"
    tags = failed[0].data.tags
    assert tags["failure.reason"].startswith("smoke gate failed: ") and tags["failure.state"] == "Failed"
    assert tags[
        "failure.resume"
    ] == f"gptpipe run --params {params} --set smoke.optimizer.learning_rate=0.5 " + (
        "--set smoke.optimizer.warmup_steps=1 --until quantize"
    )
    assert tags["failure.checkpoint"] == "none"  # no full training yet
    # ... and the flow run's page shows it as an artifact of that flow run (no deprecation warning).
    assert "FutureWarning" not in result.stderr
    query = {"artifacts": {"key": {"any_": ["gptpipe-failure"]}}}
    request = urllib.request.Request(
        f"{prefect_env['PREFECT_API_URL']}/artifacts/filter", json.dumps(query).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as response:
        artifacts = json.loads(response.read())
    ours = [a for a in artifacts if a["flow_run_id"] == tags["prefect.flow_run_id"]]
    assert len(ours) == 1 and "# The run failed in stage `smoke`" in ours[0]["data"]


# --- bad input is refused before any stage ----------------------------------------------------------


def test_bad_override_is_one_line_before_any_stage(tmp_path: Path) -> None:
    write_corpus(tmp_path, documents=3)
    params = str(write_params(tmp_path))
    result = subprocess.run(
        [*GPTPIPE, "run", "--params", params, "--set", "full.max_steps=-3"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "full.max_steps" in result.stderr and "-3" in result.stderr
    assert not (tmp_path / "data").exists()


def test_unknown_stage_for_until_is_refused(tmp_path: Path) -> None:
    from flows.cli.main import main

    assert main(["run", "--until", "everything"]) == 2


# --- the pieces the flow relies on ------------------------------------------------------------------


def test_cached_outputs_are_checked_by_content(tmp_path: Path) -> None:
    output = tmp_path / "out.bin"
    output.write_bytes(b"tokens")
    result = StageResult(files=file_record(output))
    assert result.stale_outputs() == []
    output.write_bytes(b"tokenz")
    assert result.stale_outputs() == [str(output)]
    output.unlink()
    assert result.stale_outputs() == [str(output)]


def test_a_corpus_small_for_its_model_is_named_with_the_settings_to_change() -> None:
    iteration_3 = DataSizing(parameter_count=98_400_000, train_tokens=7_800_000, full_tokens=62_400_000)
    assert iteration_3.figures() == {"tokens_per_parameter": 0.634, "train_tokens_per_parameter": 0.079}
    assert iteration_3.warning().startswith(
        "the train split holds 0.08 tokens per parameter (7,800,000 tokens"
    )
    assert "corpus.paths or corpus.hub_name" in iteration_3.warning() and "\n" not in iteration_3.warning()
    assert DataSizing(1_000_000, 20_000_000, 20_000_000).warning() is None


def test_smoke_gate_needs_finite_falling_loss_that_fits() -> None:
    vocab = 300  # ln(300) = 5.70
    assert judge([5.0, 4.0], [5.8, 4.5], peak_memory=10, memory_limit=100, vocab_size=vocab).passed
    assert not judge([5.0, 5.5], [5.8, 4.5], 10, 100, vocab).falling
    assert not judge([5.0, float("nan")], [5.8, 4.5], 10, 100, vocab).finite
    assert not judge([5.0, 4.0], [5.8, 4.5], 200, 100, vocab).fits


def test_smoke_gate_reads_validation_from_the_start_to_the_end() -> None:
    vocab = 300
    # The untrained model starts just above ln(V); that first evaluation is the baseline, not judged.
    assert judge([5.9, 5.0], [5.75, 5.78], 10, 100, vocab).passed  # within the tolerance
    rising = judge([5.9, 5.0], [5.2, 4.0, 5.6], 10, 100, vocab)
    assert rising.falling and not rising.val_not_rising and rising.below_uniform
    above = judge([5.9, 5.0], [5.8, 6.5, 5.1], 10, 100, vocab)
    assert above.val_not_rising and not above.below_uniform and above.worst_val_loss == 6.5
    assert "above the uniform guess 5.7038 = ln(vocabulary)" in above.reasons()[0]
    assert "learning rate (peak 0.05)" in above.likely_cause(0.05, "bf16")
    with pytest.raises(TrainingError, match="needs one at the start and one at the end"):
        judge([5.9, 5.0], [5.0], 10, 100, vocab)


def test_a_smoke_result_holds_its_batch_typed_and_one_cached_without_it_still_reads() -> None:
    from gptcore.runtime.batch_size import BatchChoice
    from tasks.stages.smoke import SmokeResult

    gate = judge([5.9, 5.0], [5.8, 5.1], 10, 100, 300).to_dict()  # as a record holds it
    schedule = {"steps": 2, "warmup_steps": 0}
    fields = dict(
        gate=gate, optimizer={}, schedule=schedule, precision="fp32", val_losses=[], summary={"steps": 2}
    )
    fields.update(full_planned_steps=2, estimated_full_seconds=1.0)
    saved = {"batch_size": 8, "grad_accum_steps": 2, "source": "estimated", "figures": {"tried": [8]}}
    assert SmokeResult.model_validate({**fields, "batch": saved}).batch == BatchChoice(**saved)
    assert SmokeResult.model_validate({**fields, "batch": {}}).batch is None  # cached before it was kept
    assert SmokeResult.model_validate(fields).summary.steps == 2
    assert SmokeResult.model_validate(fields).gate.passed, "the gate read back typed"


def test_iteration_2_stops_before_full_training_without_cuda() -> None:
    params = load_params(REPO / "params" / "iteration_2.yaml")
    assert "needs CUDA" in params.full_refusal("cpu")
    assert params.full_refusal("cuda") is None
    bounded = load_params(REPO / "params" / "iteration_2.yaml", ["runtime.device=cpu", "full.max_steps=5"])
    assert bounded.full_refusal("cpu") is None


def cpu_only() -> dict[str, str]:
    import os

    return {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, also on a machine that has one


def test_iteration_2_on_a_machine_without_cuda_is_refused_before_it_reads_a_token(tmp_path: Path) -> None:
    result = subprocess.run(
        [*GPTPIPE, "run", "--iteration", "2"], cwd=REPO, capture_output=True, text=True, env=cpu_only()
    )
    assert result.returncode != 0
    assert "full training needs CUDA" in result.stderr and "--until smoke" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
