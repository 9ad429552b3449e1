"""`full.init_from`: a pretraining run that starts from a model's weights and encodes its corpus with that
model's own tokenizer. Here the model is a GPT-2 saved by transformers (a few layers, random weights)
with a vocabulary of GPT-2's size, 50,257 tokens: its ids fill the token files' uint16 almost to the top,
and every stage (the smoke gate, full training, evaluation, export, quantization) takes it. The parameter
file needs no model section: the model's own files say its architecture."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from test_pipeline import GPTPIPE, REPO, gptpipe, stages_of, states, write_corpus

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
GPT2_VOCAB = 50257
END_OF_TEXT = "<|endoftext|>"


def gpt2_vocabulary(folder: Path) -> Path:
    """vocab.json and merges.txt of GPT-2's size: the 256 byte-level tokens, 50,000 merges of two of them
    (letters first, so text uses them), and `<|endoftext|>` last, at id 50,256 as in GPT-2."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet(), key=lambda char: (not char.isalpha(), char))
    vocab = {char: index for index, char in enumerate(alphabet)}
    merges = []
    for first in alphabet:
        for second in alphabet:
            if len(vocab) < GPT2_VOCAB - 1:
                merges.append(f"{first} {second}")
                vocab[first + second] = len(vocab)
    vocab[END_OF_TEXT] = len(vocab)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GPT-2 as transformers saves it, GPT-2's vocabulary size, two thin layers, a 64-token window."""
    folder = gpt2_vocabulary(tmp_path_factory.mktemp("gpt2"))
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=GPT2_VOCAB)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def continued_params(root: Path, gpt2: Path, **changes: str) -> Path:
    (root / "profiles").mkdir(parents=True, exist_ok=True)
    (root / "profiles" / "gpt2_tiny.yaml").write_text(
        "name: gpt2_tiny\n"
        f"architecture: {{n_layer: 2, n_head: 2, n_embd: 32, block_size: 64, vocab_size: {GPT2_VOCAB}}}\n"
        "cpu: {batch_size: 4, grad_accum_steps: 1, precision: fp32, workers: 0}\n"
        "gpu: {batch_size: 4, grad_accum_steps: 1, precision: fp32, workers: 0}\n"
    )
    sections = {
        "iteration": "1",
        "corpus": f'{{source: local, paths: ["{root / "corpus"}"], validation_fraction: 0.2, '
        "test_fraction: 0.1}",
        "runtime": "{device: cpu, cpu: {batch_size: 4, grad_accum_steps: 1, precision: fp32, workers: 0}}",
        "smoke": "{max_steps: 4, log_every: 2, eval_every: 4, validation_examples: 8}",
        "full": f'{{init_from: "hf:{gpt2}", max_steps: 6, log_every: 2, eval_every: 50, checkpoint_every: 6, '
        "validation_examples: 8, optimizer: {learning_rate: 1.0e-3, warmup_steps: 1}}",
        "evaluate": "{prompts: 1, max_new_tokens: 4}",
        "export": "{hf: true}",
        "quantize": "{methods: [int8-weight-only], new_tokens: 4, repeats: 1}",
        "tracking": f'{{experiment: test-pipeline, artifact_root: "{root / "mlartifacts"}"}}',
        "paths": f'{{data_root: "{root / "data"}", checkpoint_root: "{root / "checkpoints"}"}}',
        **changes,
    }
    path = root / "params.yaml"
    path.write_text("".join(f"{key}: {value}\n" for key, value in sections.items()))
    return path


@pytest.mark.slow
def test_a_run_from_a_gpt2_encodes_with_its_tokenizer_starts_from_its_weights_and_every_stage_takes_it(
    tmp_path: Path, gpt2: Path, prefect_env: dict[str, str]
) -> None:
    from mlflow import MlflowClient

    from gptcore.checkpoint.files import checkpoint_metadata
    from gptcore.data.tokenfile import open_tokens
    from gptcore.tools.fingerprint import sha256_file

    write_corpus(tmp_path, seed=5)
    run = gptpipe(prefect_env, "--params", str(continued_params(tmp_path, gpt2)))
    assert set(states(run).values()) == {"completed"}, states(run)
    stages = stages_of(run)
    assert stages["tokenizer"]["figures"]["base_model_uri"] == f"hf:{gpt2}"
    assert "training starts from its weights" in run.stderr

    tokens = open_tokens(stages["tokens"]["outputs"][0])  # the train split
    assert tokens.manifest.dtype == "uint16" and tokens.manifest.vocab_size == GPT2_VOCAB
    assert int(np.asarray(tokens.tokens).max()) > 255  # GPT-2's merges, not bytes alone, encoded the corpus

    kept = Path(stages["tokenizer"]["outputs"][0])
    final = next(Path(path) for path in stages["full"]["outputs"] if path.endswith("final.pt"))
    identity = checkpoint_metadata(final).config
    assert identity["init.weights_sha256"] == sha256_file(kept / "model.safetensors")

    figures = stages["evaluate"]["figures"]
    client = MlflowClient(tracking_uri=prefect_env["MLFLOW_TRACKING_URI"])
    version = client.get_model_version(figures["registered_model"], figures["model_version"])
    assert version.tags["base_model_uri"] == f"hf:{gpt2}"
    assert version.tags["base_weights_sha256"] == identity["init.weights_sha256"]
    exported = Path(stages["export"]["outputs"][0])
    assert json.loads((exported / "config.json").read_text())["vocab_size"] == GPT2_VOCAB
    assert stages["quantize"]["figures"]["int8-weight-only/size_ratio"] < 1.0

    named = continued_params(tmp_path, gpt2, model="gpt2_tiny")  # its architecture named: the same run
    again = gptpipe(prefect_env, "--params", str(named))
    assert states(again)["full"] == "cached" and states(again)["tokenizer"] == "completed"  # resolved again


def test_a_model_of_another_shape_or_a_tokenizer_section_is_refused_before_anything_runs(
    tmp_path: Path, gpt2: Path
) -> None:
    write_corpus(tmp_path, documents=3)
    deeper = continued_params(
        tmp_path, gpt2, model="{name: deeper, architecture: {n_layer: 3, n_head: 2, n_embd: 32, block_size: "
        f"64, vocab_size: {GPT2_VOCAB}}}, cpu: {{batch_size: 2}}, gpu: {{batch_size: 2}}}}"
    )  # fmt: skip
    refused = subprocess.run(
        [*GPTPIPE, "run", "--params", str(deeper)], cwd=REPO, capture_output=True, text=True
    )
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: {deeper}: model.architecture: n_layer 3 is not the architecture of full.init_from "
        f"hf:{gpt2} (n_layer 2); remove the model section to train the model's own"
    ]
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "data").exists()

    trained = continued_params(tmp_path, gpt2, tokenizer="{vocab_size: 300}")
    refused = subprocess.run(
        [*GPTPIPE, "run", "--params", str(trained)], cwd=REPO, capture_output=True, text=True
    )
    assert (
        refused.returncode == 2 and "tokenizer: full.init_from's model encodes the corpus" in refused.stderr
    )
