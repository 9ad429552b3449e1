"""`gptpipe benchmark`, offline: a small model scored by lm-evaluation-harness on a multiple-choice task and
a loglikelihood task defined in the harness's YAML format over local JSON (tests/fixtures/lm_eval_tasks).
The figures are the harness's own: the same as the harness run by hand on the model's export."""

from __future__ import annotations

import hashlib
import json
import sysconfig
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import torch

from gptcore.data.config import CorpusConfig, TokenizerConfig
from gptcore.data.corpus import open_corpus
from gptcore.data.tokenizer import train_tokenizer
from gptcore.export.model_files import write_model_files
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT

# The tests that score a model need the harness; the champion gate's and the tables' logic run without it.
needs_lm_eval = pytest.mark.skipif(
    find_spec("lm_eval") is None, reason="the hf extra (lm-eval) is not installed"
)
TASKS = Path(__file__).resolve().parent / "fixtures" / "lm_eval_tasks"
STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("benchmarked")
    corpus = open_corpus(CorpusConfig(source="local", paths=[str(STDLIB / "json" / "*.py")]))
    tokenizer = train_tokenizer(corpus, TokenizerConfig(vocab_size=400), folder)
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=400))
    write_model_files(model, Path(tokenizer.path), folder / "model")
    return folder / "model"


def benchmark(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from flows.cli.main import main

    code = main(["benchmark", *args])
    said = capsys.readouterr()
    return code, said.out, said.err


@needs_lm_eval
def test_a_model_is_scored_by_the_harness_on_local_yaml_tasks_as_the_harness_itself_scores_it(
    model_folder: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    code, out, err = benchmark(
        capsys,
        "--model",
        str(model_folder),
        "--tasks",
        "code_choice,code_continuation",
        "--include-path",
        str(TASKS),
    )
    assert code == 0, err
    figures = json.loads(out.strip().splitlines()[-1])["tasks"]
    assert (figures["code_choice"]["samples"], figures["code_continuation"]["samples"]) == (8, 6)

    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from gptcore.export.hf import export_hf
    from gptcore.export.model_files import read_model_files

    model = read_model_files(model_folder / "model.safetensors", model_folder / "model_config.json")
    exported = export_hf(model, model_folder / "tokenizer.json", tmp_path / "hf")
    monkeypatch.chdir(TASKS)
    by_hand = simple_evaluate(
        model=HFLM(pretrained=str(exported), device="cpu", batch_size=8),
        tasks=["code_choice", "code_continuation"],
        task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
    )
    for task in ("code_choice", "code_continuation"):  # every figure: acc, acc_norm, perplexity, stderr
        theirs = {
            key.partition(",")[0]: value for key, value in by_hand["results"][task].items() if "," in key
        }
        assert figures[task] == pytest.approx({**theirs, "samples": by_hand["n-samples"][task]["effective"]})


@needs_lm_eval
def test_limit_scores_the_first_examples_and_an_unknown_task_is_one_line(
    model_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = benchmark(
        capsys,
        "--model",
        str(model_folder),
        "--tasks",
        "code_choice",
        "--include-path",
        str(TASKS),
        "--limit",
        "3",
    )
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["tasks"]["code_choice"]["samples"] == 3
    tasks = ["--tasks", "code_choice,no_such_task", "--include-path", str(TASKS)]
    code, _, err = benchmark(capsys, "--model", str(model_folder), *tasks)
    assert code == 2 and "--tasks no_such_task: not a task lm-evaluation-harness knows" in err
    assert err.strip().count("\n") == 0


# --- in the pipeline: evaluate.benchmarks ----------------------------------------------------------------


@pytest.mark.slow(seconds=25)
@needs_lm_eval
def test_the_evaluate_stage_scores_the_listed_benchmarks_logs_and_tags_them_and_caches_on_their_files(
    tmp_path: Path,
    prefect_env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import shutil

    from mlflow import MlflowClient
    from test_pipeline import gptpipe, newest_run, stages_of, states, write_corpus, write_params

    tasks = shutil.copytree(TASKS, tmp_path / "tasks")
    write_corpus(tmp_path, seed=3)
    params = write_params(tmp_path)
    params.write_text(
        params.read_text()
        + f"evaluate: {{benchmarks: [{{task: code_choice, limit: 4}}, {{task: code_continuation}}], "
        f'benchmark_include_path: "{tasks}", benchmark_gate: code_choice/acc}}\n'
    )
    first = gptpipe(prefect_env, "--params", str(params), "--until", "evaluate")
    figures = stages_of(first)["evaluate"]["figures"]
    assert (figures["code_choice/samples"], figures["code_continuation/samples"]) == (4, 6)  # each its limit
    # The figures are the harness's on the version the stage registered: what `gptpipe benchmark` (itself
    # the harness's own figures: the first test) says of it. The continuation's perplexity names the model.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", prefect_env["MLFLOW_TRACKING_URI"])
    version = f"models:/gptpipe-iteration-1/{figures['model_version']}"
    asked = ["--model", version, "--params", str(params), "--include-path", str(tasks)]
    code, out, err = benchmark(capsys, *asked, "--tasks", "code_continuation")
    assert code == 0, err
    scored = json.loads(out.strip().splitlines()[-1])["tasks"]["code_continuation"]
    staged = {name: value for name, value in figures.items() if name.startswith("code_continuation/")}
    assert staged == pytest.approx({f"code_continuation/{metric}": value for metric, value in scored.items()})
    assert "code_choice/acc_stderr" in figures and figures["alias"] == "champion"
    assert figures["benchmark_gate"].startswith("passed: code_choice/acc")
    assert "evaluate: benchmarks (lm-evaluation-harness): code_choice/acc" in first.stderr

    logged = newest_run(prefect_env, "evaluate").data.metrics
    assert logged["code_choice/acc"] == figures["code_choice/acc"] and logged["code_choice/samples"] == 4
    client = MlflowClient(tracking_uri=prefect_env["MLFLOW_TRACKING_URI"])
    version = client.get_model_version("gptpipe-iteration-1", figures["model_version"])
    assert float(version.tags["code_continuation/perplexity"]) == figures["code_continuation/perplexity"]
    pipeline_run = client.get_run(newest_run(prefect_env, "evaluate").data.tags["mlflow.parentRunId"])
    assert "code_choice/acc" in pipeline_run.data.metrics  # a headline figure: sweeps and compare show it
    assert "code_choice/acc_stderr" not in pipeline_run.data.metrics

    again = gptpipe(prefect_env, "--params", str(params), "--until", "evaluate")
    assert states(again)["evaluate"] == "cached"
    task = tasks / "code_choice.yaml"
    task.write_text(task.read_text() + "# edited: the task's files changed, so its scores may have\n")
    changed = gptpipe(prefect_env, "--params", str(params), "--until", "evaluate")
    assert states(changed)["full"] == "cached" and states(changed)["evaluate"] == "completed"


# --- evaluate.benchmark_gate: the champion rule's second condition ----------------------------------------


def registered(client: Any, experiment: str, bits: float, scores: dict[str, float], gate: Any) -> Any:
    """A checkpoint registered through `registry.register` with its benchmark figures and the gate."""
    from tasks.tracking.models import registry

    run = client.create_run(experiment).info.run_id
    model = client.create_logged_model(experiment, source_run_id=run, name="evaluated")
    digest = hashlib.sha256(f"{bits} {sorted(scores.items())}".encode()).hexdigest()  # a checkpoint's
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry, "evaluated_model", lambda *_: model)
        return registry.register(
            client, experiment, run, "gated", Path("x.pt"), bits, digest, None, scores, gate
        )


def test_a_version_better_in_bits_but_regressed_on_the_gated_benchmark_never_takes_champion(
    tmp_path: Path,
) -> None:
    from mlflow import MlflowClient
    from tracking_support import fresh_store

    from tasks.tracking.models.gate import BenchmarkGate

    client = MlflowClient(tracking_uri=fresh_store(tmp_path))
    experiment = client.create_experiment("gate")
    first = registered(
        client, experiment, 2.0, {"code_choice/acc": 0.75}, BenchmarkGate("code_choice/acc", 0.75, True)
    )
    assert first.alias == "champion" and first.benchmark_gate.startswith("passed")
    worse_on_the_task = registered(
        client, experiment, 1.8, {"code_choice/acc": 0.5}, BenchmarkGate("code_choice/acc", 0.5, True)
    )
    assert worse_on_the_task.alias == "challenger"
    assert "code_choice/acc 0.5 regressed from champion version 1's 0.75" in worse_on_the_task.benchmark_gate
    tags = client.get_model_version("gated", worse_on_the_task.model_version).tags
    assert tags["may_hold_champion"] == "false" and tags["code_choice/acc"] == "0.5"
    as_good = registered(
        client, experiment, 1.9, {"code_choice/acc": 0.75}, BenchmarkGate("code_choice/acc", 0.75, True)
    )
    assert as_good.alias == "champion"  # no regression: the better bits per byte win
    assert str(client.get_model_version_by_alias("gated", "champion").version) == as_good.model_version


def test_the_gate_reads_lower_as_better_where_the_task_says_so_and_passes_a_champion_never_scored() -> None:
    from types import SimpleNamespace

    from tasks.tracking.models.gate import BenchmarkGate

    champion = SimpleNamespace(version="3", tags={"code_continuation/perplexity": "40.0"})
    assert BenchmarkGate("code_continuation/perplexity", 39.0, False).refusal(champion) is None
    assert "regressed" in BenchmarkGate("code_continuation/perplexity", 41.0, False).refusal(champion)
    unscored = SimpleNamespace(version="1", tags={})
    assert (
        BenchmarkGate("code_choice/acc", 0.1, True)
        .verdict(unscored)
        .startswith("passed: code_choice/acc 0.1 against no champion scored on it")
    )


def test_a_gate_naming_a_metric_the_task_did_not_give_is_one_line_naming_those_it_did() -> None:
    from gptcore.errors import ConfigError
    from gptcore.eval.benchmarks import BenchmarkScores
    from gptcore.eval.held_out import HeldOutRecord
    from tasks.params.schema import PipelineParams
    from tasks.stages.evaluate import EvaluateResult, benchmark_gate

    params = PipelineParams.model_validate(
        {
            "iteration": 1,
            "model": {
                "name": "tiny",
                "architecture": {"n_layer": 1, "n_head": 1, "n_embd": 16, "block_size": 8, "vocab_size": 300},
                "cpu": {"batch_size": 2},
                "gpu": {"batch_size": 2},
            },
            "tokenizer": {"vocab_size": 300},
            "evaluate": {"benchmarks": [{"task": "code_choice"}], "benchmark_gate": "code_choice/f1"},
        }
    )
    scores = BenchmarkScores({"code_choice": {"acc": 0.5, "acc_norm": 0.5}}, {})
    evaluation = HeldOutRecord("c", 0, 1.0, 2.7, 1.2, 1.5, 1.8, 10, 40)
    result = EvaluateResult(fingerprint="f", checkpoint="c", evaluation=evaluation, benchmarks=scores)
    with pytest.raises(
        ConfigError,
        match=r"benchmark_gate code_choice/f1: code_choice gave no f1 \(its figures: acc, acc_norm\)",
    ):
        benchmark_gate(params, result)


def test_the_sweep_table_and_a_comparison_show_each_benchmark_scored_beside_the_headline_figures() -> None:
    from flows.run_report import RunReport
    from flows.trials import TrialResult, sweep_table
    from gptcore.eval.comparison import RunFigures, comparison_table
    from tasks.params.sweep import Trial

    scored = {"code_choice/acc": 0.75, "code_choice/acc_stderr": 0.2, "code_choice/samples": 8.0}
    evaluate = {"name": "evaluate", "state": "completed", "figures": {"test_bits_per_byte": 2.1, **scored}}
    figures = RunReport.model_validate({"stages": [evaluate]}).headline()
    assert figures == {"test_bits_per_byte": 2.1, "code_choice/acc": 0.75}  # no stderr, no sample count
    with_scores = TrialResult(Trial(1, {"full.max_steps": 10}), "completed", figures)
    unscored = TrialResult(Trial(2, {"full.max_steps": 20}), "failed", {})
    header, _, first, second = sweep_table([with_scores, unscored]).splitlines()[:4]
    assert "code_choice/acc" in header and "0.75" in first and "code_choice" not in second

    runs = [RunFigures(f"run{n}", {}, {"code_choice/acc": n / 4}) for n in (2, 3)]
    rows = {line.split("|")[1].strip(): line for line in comparison_table("precision", runs).splitlines()}
    assert "0.5" in rows["code_choice/acc"] and "1.5" in rows["code_choice/acc"]  # both, and the ratio
