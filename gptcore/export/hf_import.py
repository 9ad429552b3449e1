"""A Hugging Face GPT-2 folder read into gptcore's model: the inverse of `gptcore.export.hf`.

A `GPT2LMHeadModel` folder (OpenAI's `gpt2` as the hub has it, or gptpipe's own export) is GPT-2's
layout, which gptcore's model is: the weights are renamed (an optional `transformer.` prefix), the four
`Conv1D` projections transposed, the causal-mask buffers (`attn.bias`, `attn.masked_bias`) dropped, and
the head tied to the token embedding. The model keeps its own tokenizer: `tokenizer.json`, or GPT-2's
`vocab.json` and `merges.txt` built into one (byte-level BPE, its end-of-text token special). Weights
are read as data: safetensors, or `pytorch_model.bin` through `torch.load(weights_only=True)`.

What gptcore cannot hold is refused in one line naming the folder and the field, before a weight is read:
another architecture, GELU other than GPT-2's, a LayerNorm epsilon other than 1e-5, an inner width other
than 4 x n_embd, untied embeddings, the Mistral-style attention options; missing tokenizer files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gptcore.errors import ConfigError, DataError
from gptcore.export.hf import CONV1D, LAYER_NORM_EPS
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
BUFFERS = (".attn.bias", ".attn.masked_bias")  # the causal mask GPT-2 keeps as weights: gptcore computes it
END_OF_TEXT = "<|endoftext|>"
GPT2_GELUS = ("gelu_new", "gelu_pytorch_tanh")  # the tanh approximation, gptcore's MLP


@dataclass(frozen=True)
class ImportedModel:
    model: GPT
    tokenizer: Path  # tokenizer.json (written into the output folder when built from vocab/merges)
    weights: Path  # the file the weights came from
    source: str  # the folder, as given


def hf_config(folder: Path) -> ModelConfig:
    """The GPT-2 `config.json` of `folder` as gptcore's model config; a ConfigError naming the field
    that gptcore's model does not compute."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{folder}: no config.json: not a Hugging Face model folder") from None
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path}: not a readable config ({error})") from None
    kind = config.get("model_type")
    if kind != "gpt2" or config.get("architectures", ["GPT2LMHeadModel"])[0] != "GPT2LMHeadModel":
        found = config.get("architectures", [kind])[0]
        raise ConfigError(f"{path}: model_type {kind!r} ({found}): gptpipe holds GPT-2's layout (gpt2) only")
    width = config.get("n_embd", 768)
    rules = {
        "activation_function": (config.get("activation_function", "gelu_new"), GPT2_GELUS),
        "layer_norm_epsilon": (config.get("layer_norm_epsilon", 1e-5), (LAYER_NORM_EPS,)),
        "n_inner": (config.get("n_inner") or 4 * width, (4 * width,)),
        "tie_word_embeddings": (config.get("tie_word_embeddings", True), (True,)),
        "scale_attn_by_inverse_layer_idx": (config.get("scale_attn_by_inverse_layer_idx", False), (False,)),
        "reorder_and_upcast_attn": (config.get("reorder_and_upcast_attn", False), (False,)),
        "add_cross_attention": (config.get("add_cross_attention", False), (False,)),
    }  # fmt: skip
    for field, (value, allowed) in rules.items():
        if value not in allowed:
            shown = " or ".join(map(repr, allowed))
            raise ConfigError(f"{path}: {field} {value!r}: gptcore's GPT computes {shown} only")
    try:
        return ModelConfig(
            n_layer=config.get("n_layer", 12),
            n_head=config.get("n_head", 12),
            n_embd=width,
            block_size=config.get("n_positions", 1024),
            vocab_size=config.get("vocab_size", 50257),
        )
    except ValueError as error:
        raise ConfigError(f"{path}: {first_problem(error)}") from None


def first_problem(error: ValueError) -> str:
    errors = getattr(error, "errors", None)
    if callable(errors):
        problem = errors()[0]
        return f"{'.'.join(map(str, problem['loc']))}: {problem['msg']}"
    return str(error).splitlines()[0]


def read_hf_gpt2(folder: Path, tokenizer_into: Path) -> ImportedModel:
    """The model in `folder` and its tokenizer (`tokenizer_into/tokenizer.json` when built from GPT-2's
    vocab.json and merges.txt)."""
    folder = Path(folder)
    config = hf_config(folder)
    tokenizer = hf_tokenizer(folder, tokenizer_into, config.vocab_size)
    weights = next((folder / name for name in WEIGHT_FILES if (folder / name).is_file()), None)
    if weights is None:
        raise DataError(f"{folder}: no weights ({' or '.join(WEIGHT_FILES)})")
    model = GPT(config)
    model.load_state_dict(gptcore_state(read_weights(weights), config, weights))
    return ImportedModel(model.eval(), tokenizer, weights, str(folder))


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a damaged file, or a pickle holding objects that are not tensors
        raise DataError(f"{path}: cannot be read as tensors ({type(error).__name__})") from None


def gptcore_state(
    weights: dict[str, torch.Tensor], config: ModelConfig, path: Path
) -> dict[str, torch.Tensor]:
    """GPT-2's names and layout as gptcore's (`GPT.state_dict()`), the head tied to the embedding."""
    state: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        name = name if name.startswith(("transformer.", "lm_head.")) else f"transformer.{name}"
        if name.endswith(BUFFERS) or name == "lm_head.weight":
            continue
        state[name] = tensor.t().contiguous() if name.endswith(CONV1D) else tensor
    state["lm_head.weight"] = state.get("transformer.wte.weight", torch.empty(0))
    wanted = _expected_shapes(config)
    missing = sorted(set(wanted) - set(state))
    extra = sorted(set(state) - set(wanted))
    if missing or extra:
        what = f"missing {', '.join(missing[:3])}" if missing else f"unknown {', '.join(extra[:3])}"
        raise DataError(f"{path}: not GPT-2's weights for its config.json ({what})")
    wrong = [name for name, shape in wanted.items() if tuple(state[name].shape) != shape]
    if wrong:
        name = wrong[0]
        shape = tuple(state[name].shape)
        raise DataError(f"{path}: {name} has shape {shape}, its config.json says {wanted[name]}")
    return {name: tensor.to(torch.float32) for name, tensor in state.items()}


def _expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        return {name: tuple(tensor.shape) for name, tensor in GPT(config).state_dict().items()}


def hf_tokenizer(folder: Path, into: Path, vocab_size: int) -> Path:
    """The folder's `tokenizer.json`, else one built from GPT-2's `vocab.json` + `merges.txt`; a
    DataError naming what is missing, or a vocabulary the model's embedding cannot hold."""
    from tokenizers import Tokenizer

    if (folder / "tokenizer.json").is_file():
        path = folder / "tokenizer.json"
    elif (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        path = _built_tokenizer(folder, into)
    else:
        raise DataError(f"{folder}: no tokenizer (tokenizer.json, or vocab.json with merges.txt)")
    try:
        size = Tokenizer.from_file(str(path)).get_vocab_size()
    except Exception:  # the Rust loader raises a bare Exception for any malformed file
        raise DataError(f"{path}: not a loadable tokenizer") from None
    if size > vocab_size:
        raise DataError(f"{path}: its vocabulary of {size} is larger than the model's {vocab_size}")
    return path


def _built_tokenizer(folder: Path, into: Path) -> Path:
    """GPT-2's byte-level BPE from its vocab.json and merges.txt, the end-of-text token special."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    end_of_text = _end_of_text(folder)
    tokenizer = Tokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(end_of_text, special=True)])
    into.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(into / "tokenizer.json"))
    return into / "tokenizer.json"


def _end_of_text(folder: Path) -> str:
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        try:
            token: Any = json.loads((folder / name).read_text(encoding="utf-8")).get("eos_token")
        except (OSError, ValueError):
            continue
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str) and token:
            return token
    return END_OF_TEXT
