"""The modern recipe through every stage of the pipeline, beside GPT-2's: the second parameter file reuses
the first's tokenizer and token files, and both runs land in one experiment, told apart by their params."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_pipeline import gptpipe, newest_run, stages_of, states, write_corpus, write_params

MODERN_ARCHITECTURE = (
    "{n_layer: 1, n_head: 2, n_embd: 32, block_size: 32, vocab_size: 320, bias: false, position: rotary, "
    "norm: rmsnorm, qk_norm: true, mlp: swiglu, tie_embeddings: false}"
)


def modern_params(root: Path, gpt2: Path) -> Path:
    """`gpt2`'s parameter file with the tiny profile in the modern recipe and Muon in both sections."""
    profile = (root / "profiles" / "tiny.yaml").read_text().replace("name: tiny", "name: tiny_modern")
    profile = profile.replace(profile.split("architecture: ")[1].split("\n")[0], MODERN_ARCHITECTURE)
    (root / "profiles" / "tiny_modern.yaml").write_text(profile)
    text = gpt2.read_text().replace("model: tiny", "model: tiny_modern")
    text = text.replace("optimizer: {", "optimizer: {name: muon, muon_learning_rate: 0.02, ")
    path = root / "modern.yaml"
    path.write_text(text)
    return path


@pytest.mark.slow
def test_the_modern_recipe_runs_every_stage_and_compares_with_gpt2s_in_one_experiment(
    tmp_path: Path, prefect_env: dict[str, str]
) -> None:
    write_corpus(tmp_path)
    gpt2 = write_params(tmp_path)
    gptpipe(prefect_env, "--params", str(gpt2))
    gpt2_run = newest_run(prefect_env, "full")

    modern = gptpipe(prefect_env, "--params", str(modern_params(tmp_path, gpt2)))
    assert states(modern) == {
        **dict.fromkeys(stages_of(modern), "completed"),
        "tokenizer": "cached",  # the same corpus and tokenizer settings: one set of token files
        "tokens": "cached",
    }
    modern_run = newest_run(prefect_env, "full")
    assert modern_run.info.experiment_id == gpt2_run.info.experiment_id
    compared = [
        (run.data.params["model.recipe"], run.data.params["optimizer.name"]) for run in (gpt2_run, modern_run)
    ]
    assert compared == [("gpt2", "adamw"), ("rotary+rmsnorm+qk_norm+swiglu+untied", "muon")]
    assert modern_run.data.params["optimizer.muon_learning_rate"] == "0.02"

    figures = stages_of(modern)
    assert figures["evaluate"]["figures"]["test_bits_per_byte"] > 0
    exported = Path(figures["export"]["outputs"][0])
    assert json.loads((exported / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    assert figures["quantize"]["figures"]["int8-weight-only/size_ratio"] < 1.0
