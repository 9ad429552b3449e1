"""A trained model as a Hugging Face folder that `transformers` loads offline: GPT-2's layout as a
`GPT2LMHeadModel` (here), the modern recipe (rotary, RMSNorm, SwiGLU) as a `LlamaForCausalLM` or, with
QK-norm, a `Qwen3ForCausalLM` (`gptcore.export.hf_llama`); any other recipe is refused before anything is
written. The folder's tokenizer, special-token and generation files are the same for every layout.

A GPT-2 model already has GPT-2's layout and names, so the export is a renaming plus GPT-2's `Conv1D`
layout: the four projection weights (`c_attn`, `attn.c_proj`, `c_fc`, `mlp.c_proj`) are stored
transposed. The output head is tied to the token embedding and stored once (`tie_word_embeddings`);
a profile without biases exports zero biases, which compute the same. Nothing here imports
`transformers`: the folder is plain files, written into a hidden sibling and renamed into place whole.

- `config.json`: a `GPT2Config` whose fields match the model exactly (sizes, `n_positions` = the block
  size, `gelu_new` = our tanh-approximated GELU, LayerNorm epsilon 1e-5, no dropout, bos/eos = the
  end-of-text id).
  (`LlamaConfig`, `Qwen3Config`: `gptcore.export.hf_llama`.)
- `model.safetensors`: the weights under the layout's names.
- `tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json`: a `PreTrainedTokenizerFast`; a
  chat model's `tokenizer_config.json` holds its `chat_template`, and its generation ends at `<|end|>`.
- `generation_config.json`: bos/eos/pad = end-of-text.
- `README.md`: the model card (`gptcore.export.card`): the hub's metadata and the run's figures.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from gptcore.chat.template import END_OF_TURN, chat_template_of
from gptcore.data.tokenfile import check_tokenizer
from gptcore.errors import ConfigError, DataError
from gptcore.export.card import CARD, CardFacts, card_text
from gptcore.export.hf_llama import HOLDS, check_llama, llama_config, llama_state_dict
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT
from gptcore.tools.atomic import publish_directory, staging_directory
from gptcore.tools.records import JSONObject

CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which the model uses


def gpt2_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """The weights under GPT-2's names and layout (Conv1D weights transposed, zero biases where the
    model has none, the tied head left to `tie_word_embeddings`)."""
    state = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    state.pop("lm_head.weight", None)  # the same tensor as transformer.wte.weight
    width = model.config.n_embd
    exported: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        exported[name] = tensor.t().contiguous() if name.endswith(CONV1D) else tensor.contiguous()
    if not model.config.bias:
        sizes = {"ln_1": width, "ln_2": width, "attn.c_attn": 3 * width, "attn.c_proj": width}
        sizes.update({"mlp.c_fc": 4 * width, "mlp.c_proj": width})
        for layer in range(model.config.n_layer):
            for part, size in sizes.items():
                exported[f"transformer.h.{layer}.{part}.bias"] = torch.zeros(size)
        exported["transformer.ln_f.bias"] = torch.zeros(width)
    return exported


def gpt2_config(model: GPT, end_of_text: int) -> JSONObject:
    cfg = model.config
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.block_size,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": 4 * cfg.n_embd,
        "activation_function": "gelu_new",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "use_cache": True,
        "bos_token_id": end_of_text,
        "eos_token_id": end_of_text,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }


StateDict = Callable[[GPT], dict[str, torch.Tensor]]
Config = Callable[[GPT, int], JSONObject]


def layout(config: ModelConfig) -> tuple[StateDict, Config]:
    """The writers of the Hugging Face layout that holds `config`'s recipe; a ConfigError in one line,
    naming the fields that keep it from any, when none does."""
    if config.position == "rotary":
        check_llama(config)
        return llama_state_dict, llama_config
    # Learned positions never read rope_theta: a changed one leaves GPT-2's layout as it is.
    misfits = {key: value for key, value in config.recipe().items() if key != "rope_theta"}
    if misfits:
        fields = ", ".join(f"{key} {value!r}" for key, value in misfits.items())
        raise ConfigError(f"export: position 'learned' with {fields}: {HOLDS}")
    return gpt2_state_dict, gpt2_config


def end_of_text_of(tokenizer_path: Path) -> tuple[int, str]:
    """The tokenizer's end-of-text id and text: its first special (added) token."""
    data = json.loads(Path(tokenizer_path).read_text(encoding="utf-8"))
    special = [token for token in data.get("added_tokens", []) if token.get("special")]
    if not special:
        raise DataError(f"{tokenizer_path}: the tokenizer has no special end-of-text token")
    return int(special[0]["id"]), str(special[0]["content"])


def chat_of(tokenizer_path: Path) -> tuple[str, int] | None:
    """A chat model's template (stored beside its tokenizer) and its end-of-turn id; None: no chat."""
    template = chat_template_of(Path(tokenizer_path).parent)
    if template is None:
        return None
    data = json.loads(Path(tokenizer_path).read_text(encoding="utf-8"))
    ids = {token["content"]: int(token["id"]) for token in data.get("added_tokens", [])}
    if END_OF_TURN not in ids:
        raise DataError(f"{tokenizer_path}: a chat template beside it, but no {END_OF_TURN} token in it")
    return template, ids[END_OF_TURN]


def export_hf(
    model: GPT, tokenizer_path: Path, output: Path, force: bool = False, facts: CardFacts | None = None
) -> Path:
    """Write the Hugging Face folder for `model` at `output`, its model card from `facts` (the run's
    records; None: what the model itself says); an existing non-empty folder is refused unless `force`.
    Returns the folder."""
    from safetensors.torch import save_file

    output = Path(output)
    state_dict, config = layout(model.config)  # a recipe no layout holds: refused before any writing
    check_output(output, force)
    check_tokenizer(tokenizer_path, model.config.vocab_size)  # loadable, and fits the model
    eot_id, eot = end_of_text_of(tokenizer_path)
    weights = state_dict(model)
    needed = sum(t.numel() * t.element_size() for t in weights.values()) + tokenizer_path.stat().st_size
    with staging_directory(output, needed) as folder:
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        _json(folder / "config.json", config(model, eot_id))
        shutil.copyfile(tokenizer_path, folder / "tokenizer.json")
        specials = {"bos_token": eot, "eos_token": eot, "unk_token": eot}
        _json(folder / "special_tokens_map.json", specials)
        chat = chat_of(tokenizer_path)
        tokenizer_config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": model.config.block_size,
            "clean_up_tokenization_spaces": False,
            **specials,
        }
        if chat is not None:  # apply_chat_template renders what gptpipe encodes (gptcore.chat.template)
            tokenizer_config["chat_template"] = chat[0]
        _json(folder / "tokenizer_config.json", tokenizer_config)
        ends = [eot_id] if chat is None else [eot_id, chat[1]]  # a chat model's answer ends at <|end|>
        _json(
            folder / "generation_config.json",
            {"bos_token_id": eot_id, "eos_token_id": ends if chat else eot_id, "pad_token_id": eot_id,
             "do_sample": False},
        )  # fmt: skip
        facts = replace(facts or CardFacts(name=Path(output).name), chat=chat is not None)
        (folder / CARD).write_text(card_text(model, facts), encoding="utf-8")
        publish_directory(folder, output)
    return output


# What an export writes (a model's folder, or PEFT's adapter: gptcore.finetune.peft): `--force` replaces
# a folder holding these alone (an earlier export), nothing else.
EXPORT_FILES = frozenset(
    {"model.safetensors", "config.json", "tokenizer.json", "special_tokens_map.json", "tokenizer_config.json",
     "generation_config.json", "README.md", "adapter_config.json", "adapter_model.safetensors"}
)  # fmt: skip


def check_output(output: Path, force: bool) -> None:
    """An output folder that is absent or empty; with `force`, also one an earlier export wrote."""
    if not output.exists() and not output.is_symlink():
        return
    folder = output.is_dir() and not output.is_symlink()
    if folder and not any(output.iterdir()):
        return
    if not force:
        raise ConfigError(f"--output {output}: exists and is not empty; choose another folder or add --force")
    others = (
        sorted(p.name for p in output.iterdir() if p.name not in EXPORT_FILES or not p.is_file())
        if folder
        else []
    )
    if not folder or others:
        what = f"holds {', '.join(others[:3])}" if folder else "is not a folder"
        raise ConfigError(
            f"--output {output}: {what}, which no export wrote; --force replaces only an earlier export"
        )


def _json(path: Path, value: JSONObject) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
