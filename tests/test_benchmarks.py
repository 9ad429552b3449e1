"""`gptpipe benchmark`, offline: a small model scored by lm-evaluation-harness on a multiple-choice task and
a loglikelihood task defined in the harness's YAML format over local JSON (tests/fixtures/lm_eval_tasks).
The figures are the harness's own: the same as the harness run by hand on the model's export."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
import torch

from gptcore.data.config import CorpusConfig, TokenizerConfig
from gptcore.data.corpus import open_corpus
from gptcore.data.tokenizer import train_tokenizer
from gptcore.export.model_files import write_model_files
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT

pytest.importorskip("lm_eval", reason="the hf extra (lm-eval) is not installed")
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
    choice, continuation = figures["code_choice"], figures["code_continuation"]
    assert choice["samples"] == 8 and 0 <= choice["acc"] <= 1 and 0 <= choice["acc_norm"] <= 1
    assert "acc_stderr" in choice and continuation["samples"] == 6 and continuation["perplexity"] > 1

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
        tasks=["code_choice"],
        task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
    )["results"]["code_choice"]
    assert (by_hand["acc,none"], by_hand["acc_norm,none"]) == (choice["acc"], choice["acc_norm"])


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
