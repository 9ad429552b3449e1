"""The modern recipe's Hugging Face export (Llama, Qwen3), proven with `transformers` itself, offline:
the architecture it names, the logits it computes; and the recipes no layout holds, refused in one line."""

from __future__ import annotations

import json
import re
import sysconfig
from pathlib import Path

import pytest
import torch

from gptcore.data.config import CorpusConfig, TokenizerConfig
from gptcore.data.corpus import open_corpus
from gptcore.data.tokenizer import train_tokenizer
from gptcore.errors import ConfigError
from gptcore.export.hf import export_hf
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT

transformers = pytest.importorskip("transformers")  # the `hf` extra, which `make test` installs

SHAPE = {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 32, "vocab_size": 300}
LLAMA = {"position": "rotary", "norm": "rmsnorm", "mlp": "swiglu"}
HOLDS = (
    "the Hugging Face export holds GPT-2's layout or Llama's (rotary, rmsnorm, swiglu; Qwen3's with qk_norm)"
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real byte-level BPE tokenizer of 300 ids, trained on a little of the standard library."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    corpus = open_corpus(
        CorpusConfig(source="local", paths=[str(stdlib / "json" / "*.py")], validation_fraction=0.2)
    )
    return Path(train_tokenizer(corpus, TokenizerConfig(vocab_size=300), tmp_path_factory.mktemp("t")).path)


def perturbed(config: ModelConfig) -> GPT:
    """A model whose every weight is off its init (biases and norm weights too), so a misplaced or
    dropped one shows in the logits."""
    torch.manual_seed(0)
    model = GPT(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model


@pytest.mark.parametrize(
    ("recipe", "architecture"),
    [
        ({"bias": False, "tie_embeddings": True}, "LlamaForCausalLM"),
        ({"bias": True, "tie_embeddings": True, "rope_theta": 500.0}, "LlamaForCausalLM"),
        ({"bias": False, "tie_embeddings": False, "rope_theta": 500.0}, "LlamaForCausalLM"),
        ({"bias": True, "tie_embeddings": False}, "LlamaForCausalLM"),
        ({"bias": False, "qk_norm": True}, "Qwen3ForCausalLM"),
        ({"bias": False, "qk_norm": True, "tie_embeddings": False, "rope_theta": 500.0}, "Qwen3ForCausalLM"),
    ],
)
def test_transformers_loads_the_modern_export_as_its_architecture_and_computes_what_we_compute(
    tmp_path: Path, tokenizer: Path, recipe: dict[str, object], architecture: str
) -> None:
    model = perturbed(ModelConfig(**SHAPE, **LLAMA, **recipe))
    folder = export_hf(model, tokenizer, tmp_path / "hf")
    assert json.loads((folder / "config.json").read_text())["architectures"] == [architecture]
    theirs, loading = transformers.AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, output_loading_info=True
    )
    assert type(theirs).__name__ == architecture and theirs.dtype == torch.float32
    assert not loading["missing_keys"] and not loading["unexpected_keys"]
    ids = torch.randint(
        0, SHAPE["vocab_size"], (2, SHAPE["block_size"]), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        ours, _ = model(ids, ids)  # targets given: the logits of every position
        logits = theirs.eval()(ids).logits
    assert (ours - logits).abs().max().item() < 1e-4
    their_tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert their_tokenizer.eos_token_id == theirs.config.eos_token_id


def test_a_rope_theta_that_learned_positions_never_read_leaves_the_gpt2_export(
    tmp_path: Path, tokenizer: Path
) -> None:
    folder = export_hf(GPT(ModelConfig(**SHAPE, rope_theta=500.0)), tokenizer, tmp_path / "hf")
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["GPT2LMHeadModel"]


@pytest.mark.parametrize(
    ("recipe", "fields"),
    [
        ({"position": "rotary"}, "position 'rotary' with norm 'layernorm', mlp 'gelu'"),
        ({**LLAMA, "mlp": "relu2"}, "position 'rotary' with mlp 'relu2'"),
        ({**LLAMA, "mlp": "gelu", "qk_norm": True}, "position 'rotary' with mlp 'gelu'"),
        ({**LLAMA, "norm": "layernorm"}, "position 'rotary' with norm 'layernorm'"),
        ({"norm": "rmsnorm"}, "position 'learned' with norm 'rmsnorm'"),
        ({"norm": "rmsnorm", "mlp": "swiglu"}, "position 'learned' with norm 'rmsnorm', mlp 'swiglu'"),
        ({"qk_norm": True}, "position 'learned' with qk_norm True"),
        ({"tie_embeddings": False}, "position 'learned' with tie_embeddings False"),
    ],
)
def test_a_recipe_no_hugging_face_layout_holds_is_refused_in_one_line_before_anything_is_written(
    tmp_path: Path, tokenizer: Path, recipe: dict[str, object], fields: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        export_hf(GPT(ModelConfig(**SHAPE, **recipe)), tokenizer, tmp_path / "hf")
    assert str(refused.value) == f"export: {fields}: {HOLDS}"
    assert not (tmp_path / "hf").exists()


def test_qk_norm_with_biases_is_refused_since_qwen3_has_no_mlp_biases(
    tmp_path: Path, tokenizer: Path
) -> None:
    model = GPT(ModelConfig(**SHAPE, **LLAMA, qk_norm=True, bias=True))
    with pytest.raises(ConfigError) as refused:
        export_hf(model, tokenizer, tmp_path / "hf")
    message = str(refused.value)
    assert "\n" not in message
    assert re.fullmatch(r"export: qk_norm True with bias True: Qwen3 .* has no MLP biases; .*", message)
    assert not (tmp_path / "hf").exists()
