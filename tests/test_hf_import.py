"""A GPT-2 as the field has it, read into gptcore's model: a `GPT2LMHeadModel` made with transformers' own
config class and saved locally (random weights, a few layers: no hub here) computes the same logits in
gptcore; gptpipe's own export reads back to the same model; what gptcore cannot hold is one line."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
import torch

from gptcore.errors import ConfigError, DataError
from gptcore.export.hf import export_hf
from gptcore.export.hf_import import read_hf_gpt2

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
STDLIB = Path(sysconfig.get_paths()["stdlib"])
VOCAB = 400


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GPT-2's tokenizer files (vocab.json, merges.txt), trained on the json package's sources."""
    from tokenizers import ByteLevelBPETokenizer

    folder = tmp_path_factory.mktemp("gpt2-tokenizer")
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train([str(p) for p in (STDLIB / "json").glob("*.py")], vocab_size=VOCAB - 1, special_tokens=[])
    tokenizer.save_model(str(folder))
    return folder


def gpt2_folder(folder: Path, tokenizer_files: Path, safe: bool = True, **config: object) -> Path:
    """A GPT-2 saved by transformers itself, with GPT-2's tokenizer files beside it."""
    import shutil

    torch.manual_seed(0)
    settings = dict(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=VOCAB, resid_pdrop=0.0,
                    embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**settings, **config}))
    model.save_pretrained(folder)
    if not safe:  # as OpenAI's gpt2 is on the hub: a pickle of tensors, no `transformer.` prefix, masks kept
        state = {name.removeprefix("transformer."): tensor for name, tensor in model.state_dict().items()}
        window = settings["n_positions"]
        for layer in range(settings["n_layer"]):
            state[f"h.{layer}.attn.bias"] = torch.tril(torch.ones(window, window)).view(1, 1, window, window)
        torch.save(state, folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(tokenizer_files / name, folder / name)
    return folder


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_model.bin"])
def test_a_transformers_gpt2_computes_the_same_logits_in_gptcore(
    tmp_path: Path, tokenizer_files: Path, safe: bool
) -> None:
    folder = gpt2_folder(tmp_path / "gpt2", tokenizer_files, safe=safe)
    imported = read_hf_gpt2(folder, tmp_path / "tokenizer")
    theirs = transformers.GPT2LMHeadModel.from_pretrained(folder, local_files_only=True).eval()
    ids = torch.randint(0, VOCAB, (2, 64))
    with torch.no_grad():
        expected = theirs(ids).logits
        ours, _ = imported.model(ids, targets=ids)  # targets: the logits of every position
    assert (ours - expected).abs().max().item() < 1e-4
    assert imported.weights.name == ("model.safetensors" if safe else "pytorch_model.bin")
    from tokenizers import Tokenizer

    built = Tokenizer.from_file(str(imported.tokenizer))
    assert (
        built.token_to_id("<|endoftext|>") is not None
        and built.decode(built.encode("def f(x):").ids) == "def f(x):"
    )


def test_gptpipes_own_export_reads_back_to_the_same_model(tmp_path: Path) -> None:
    from gptcore.data.config import CorpusConfig, TokenizerConfig
    from gptcore.data.corpus import open_corpus
    from gptcore.data.tokenizer import train_tokenizer
    from gptcore.model.config import ModelConfig
    from gptcore.model.gpt import GPT

    corpus = open_corpus(CorpusConfig(source="local", paths=[str(STDLIB / "json" / "*.py")]))
    tokenizer = train_tokenizer(corpus, TokenizerConfig(vocab_size=VOCAB), tmp_path)
    torch.manual_seed(1)
    model = GPT(
        ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=VOCAB, bias=True)
    ).eval()
    folder = export_hf(model, Path(tokenizer.path), tmp_path / "export")
    back = read_hf_gpt2(folder, tmp_path / "unused")
    ids = torch.randint(0, VOCAB, (2, 32))
    with torch.no_grad():
        assert torch.equal(back.model(ids, targets=ids)[0], model(ids, targets=ids)[0])
    assert back.tokenizer == folder / "tokenizer.json"


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (
            {"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
            ConfigError,
            r"config.json: model_type 'llama' \(LlamaForCausalLM\): gptpipe holds GPT-2's layout \(gpt2\)",
        ),
        (
            {"activation_function": "relu"},
            ConfigError,
            r"config.json: activation_function 'relu': gptcore's GPT computes 'gelu_new' or 'gelu_pyto",
        ),
        ({"layer_norm_epsilon": 1e-6}, ConfigError, r"config.json: layer_norm_epsilon 1e-06: gptcore's GPT"),
        ({"n_inner": 100}, ConfigError, r"config.json: n_inner 100: gptcore's GPT computes 128 only"),
        (
            {"vocab_size": 300},
            DataError,
            r"tokenizer.json: its vocabulary of 400 is larger than the model's 300",
        ),
    ],
    ids=["llama", "relu", "epsilon", "inner-width", "vocabulary"],
)
def test_what_gptcore_cannot_hold_is_refused_in_one_line_before_a_weight_is_read(
    tmp_path: Path, tokenizer_files: Path, change: dict, error: type, message: str
) -> None:
    folder = gpt2_folder(tmp_path / "gpt2", tokenizer_files)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(error, match=message) as raised:
        read_hf_gpt2(folder, tmp_path / "tokenizer")
    assert "\n" not in str(raised.value)


def test_missing_tokenizer_files_are_named(tmp_path: Path, tokenizer_files: Path) -> None:
    folder = gpt2_folder(tmp_path / "gpt2", tokenizer_files)
    (folder / "merges.txt").unlink()
    with pytest.raises(
        DataError, match=r"gpt2: no tokenizer \(tokenizer.json, or vocab.json with merges.txt\)"
    ):
        read_hf_gpt2(folder, tmp_path / "tokenizer")


def test_gptpipe_import_registers_it_and_its_models_uris_generate_as_the_folder_does(
    tmp_path: Path, tokenizer_files: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow import MlflowClient
    from tracking_support import fresh_store

    from flows.cli.main import main
    from gptcore.generate import Completer

    folder = gpt2_folder(tmp_path / "gpt2", tokenizer_files)
    store = fresh_store(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    assert main(["import", f"hf:{folder}", "--name", "gpt2-tiny"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert (said["model_uri"], said["alias"], said["source"]) == (
        "models:/gpt2-tiny/1",
        "imported",
        f"hf:{folder}",
    )
    # The weights lie beside the store the import was told of, not in the working folder's mlruns/.
    source = MlflowClient(tracking_uri=store).get_model_version("gpt2-tiny", "1").source
    assert source.startswith((tmp_path / "mlruns" / "artifacts").resolve().as_uri() + "/"), source
    assert (Path(source.removeprefix("file://")) / "artifacts" / "model.safetensors").is_file()
    assert main(["import", f"hf:{folder}", "--name", "gpt2-tiny"]) == 0  # the same weights: the same version
    assert json.loads(capsys.readouterr().out)["model_version"] == "1"

    greedy = ["--prompt", "def load(", "--max-new-tokens", "6", "--temperature", "0", "--json"]
    assert main(["generate", "--model", "models:/gpt2-tiny@imported", *greedy]) == 0
    from_registry = json.loads(capsys.readouterr().out)["completion"]
    assert main(["generate", "--model", f"hf:{folder}", *greedy]) == 0
    from_folder = json.loads(capsys.readouterr().out)["completion"]
    imported = read_hf_gpt2(folder, tmp_path / "tokenizer")
    expected = Completer.from_paths(imported.model, imported.tokenizer).complete(
        ["def load("], 6, temperature=0
    )[0]
    assert from_registry == from_folder == expected

    assert main(["import", "gpt2", "--name", "x"]) == 2
    assert "expected hf:FOLDER or hf:HUB_ID" in capsys.readouterr().err


def test_exporting_an_hf_model_leaves_no_downloaded_copy_behind(
    tmp_path: Path, tokenizer_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from flows.cli.main import main

    folder = gpt2_folder(tmp_path / "gpt2", tokenizer_files)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the command's temporary folders go
    assert main(["export", "--model", f"hf:{folder}", "--output", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert list(scratch.iterdir()) == []  # the model's files were read in a folder removed after
