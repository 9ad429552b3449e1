"""The Hugging Face export, proven with `transformers` itself, offline: logits, tokenizer ids, greedy text."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from gptcore.checkpoint.load import load_model
from gptcore.data.build import build_token_files
from gptcore.data.config import CorpusConfig, TokenizerConfig
from gptcore.data.corpus import open_corpus
from gptcore.data.documents import split_documents
from gptcore.data.tokenfile import open_tokens
from gptcore.data.tokenizer import train_tokenizer
from gptcore.errors import ConfigError, DiskFullError
from gptcore.export.hf import export_hf
from gptcore.generate import Completer
from gptcore.model.config import ModelConfig
from gptcore.runtime.config import RuntimeConfig
from gptcore.train.config import OptimizerConfig, TrainingConfig
from gptcore.train.job import TrainJob
from gptcore.train.trainer import train
from tests.disk_full_support import leftovers, no_space, snapshot

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def trained_model(folder: Path, bias: bool) -> tuple[Path, Path, Path, list[str]]:
    """A short training on real text: (checkpoint, tokenizer, test tokens, test documents)."""
    paths = [str(STDLIB / "json" / "*.py"), str(STDLIB / "email" / "*.py")]
    corpus = open_corpus(
        CorpusConfig(source="local", paths=paths, validation_fraction=0.2, test_fraction=0.2)
    )
    tokenizer = train_tokenizer(corpus, TokenizerConfig(vocab_size=400), folder)
    tokens = build_token_files(corpus, tokenizer, folder)
    train(
        TrainJob(
            model=ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=400, bias=bias),
            runtime=RuntimeConfig(device="cpu", precision="fp32", batch_size=4),
            training=TrainingConfig(
                max_steps=20, log_every=10, eval_every=20, optimizer=OptimizerConfig(warmup_steps=2)
            ),
            train_tokens=Path(tokens.train.path),
            validation_tokens=Path(tokens.validation.path),
            checkpoint_directory=folder / "run",
            tokenizer=Path(tokenizer.path),
        )
    )
    return (
        folder / "run" / "final.pt",
        Path(tokenizer.path),
        Path(tokens.test.path),
        [
            doc.text
            for unit in corpus.units()
            for split, doc in split_documents(unit, corpus.reading)
            if split == "test"
        ],
    )


@pytest.mark.parametrize("bias", [True, False])
def test_transformers_loads_the_export_offline_and_computes_what_we_compute(
    tmp_path: Path, bias: bool
) -> None:
    # this test alone needs the `hf` extra (which `make test` installs): the export itself needs none
    transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
    checkpoint, tokenizer_path, test_tokens, documents = trained_model(tmp_path, bias)
    model, _ = load_model(checkpoint)
    folder = export_hf(model, tokenizer_path, tmp_path / "hf")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    their_tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)

    stream = open_tokens(test_tokens).tokens[: 4 * 32].astype(np.int64).reshape(4, 32)
    windows = torch.from_numpy(stream)
    with torch.no_grad():
        ours, _ = model(windows, windows)  # targets given: the logits of every position
        logits = theirs(windows).logits
    assert (ours - logits).abs().max().item() < 1e-4

    ours_tokenizer = Completer.from_paths(model, tokenizer_path).tokenizer
    for text in documents[:3]:
        assert their_tokenizer(text)["input_ids"] == ours_tokenizer.encode(text).ids

    prompt = "def load("
    completer = Completer.from_paths(model, tokenizer_path)
    expected = completer.complete_ids([prompt], 12, 0.0, None, 0)[0]
    ids = torch.tensor([ours_tokenizer.encode(prompt).ids])
    generated = theirs.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert generated[0, ids.shape[1] :].tolist() == expected


def test_an_export_never_overwrites_a_folder_that_holds_something_and_force_only_an_earlier_export(
    tmp_path: Path,
) -> None:
    checkpoint, tokenizer_path, _, _ = trained_model(tmp_path, bias=True)
    model, _ = load_model(checkpoint)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"--output .*busy: exists and is not empty; .* --force"):
        export_hf(model, tokenizer_path, tmp_path / "busy")
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"
    with pytest.raises(
        ConfigError, match=r"busy: holds notes.txt, which no export wrote; --force replaces only"
    ):
        export_hf(model, tokenizer_path, tmp_path / "busy", force=True)  # not an export: --force spares it
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(ConfigError, match=r"afile: is not a folder, which no export wrote"):
        export_hf(model, tokenizer_path, tmp_path / "afile", force=True)
    export_hf(model, tokenizer_path, tmp_path / "earlier")
    (tmp_path / "earlier" / "config.json").write_text("{}")
    export_hf(model, tokenizer_path, tmp_path / "earlier", force=True)  # an earlier export: replaced
    assert json.loads((tmp_path / "earlier" / "config.json").read_text())["n_layer"] == 2


@pytest.mark.parametrize("point", ["weights", "config", "tokenizer"])
def test_a_full_disk_during_an_export_keeps_the_earlier_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    import safetensors.torch

    from gptcore.export import hf as hf_export

    checkpoint, tokenizer_path, _, _ = trained_model(tmp_path, bias=True)
    model, _ = load_model(checkpoint)
    output = export_hf(model, tokenizer_path, tmp_path / "export")
    before = snapshot(output)

    def filling(*args: object, **kwargs: object) -> None:
        raise no_space()

    if point == "weights":
        monkeypatch.setattr(safetensors.torch, "save_file", filling)
    elif point == "config":
        monkeypatch.setattr(hf_export, "_json", filling)
    else:
        monkeypatch.setattr(hf_export.shutil, "copyfile", filling)
    with pytest.raises(DiskFullError) as full:
        export_hf(model, tokenizer_path, output, force=True)
    weights = 4 * sum(p.numel() for p in hf_export.gpt2_state_dict(model).values())
    message = str(full.value)
    needs = f"it needs about {(weights + tokenizer_path.stat().st_size) / 1e6:,.1f} MB"
    assert message.startswith(f"{output}: no space left on the disk: {needs}")
    assert message.endswith("the earlier export is unchanged; free space and run again")
    assert snapshot(output) == before and leftovers(tmp_path) == []
    monkeypatch.undo()
    assert export_hf(model, tokenizer_path, output, force=True) == output
