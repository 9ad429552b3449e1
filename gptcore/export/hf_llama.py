"""The modern recipe as a Hugging Face Llama (or, with QK-norm, Qwen3) folder's weights and config.

A model with rotary positions, RMSNorm and a SwiGLU MLP is Llama's layout under other names: the
export splits the fused linears (`c_attn` into q, k, v; SwiGLU's `c_fc` into gate and up, gate first
as `gptcore.model.mlp` chunks it) and renames the rest. Both are `nn.Linear` on both sides, so
nothing is transposed, and the rotation pairs i with i + head_dim/2 (`rotate_half`) on both sides, so
q and k need no permutation. With QK-norm (an RMSNorm per head dimension over q and k, before the
rotation) the layout is Qwen3's, whose MLP has no biases: a model with biases and QK-norm is refused.
Nothing here imports `transformers`; `gptcore.export.hf` writes the folder.
"""

from __future__ import annotations

import re

import torch

from gptcore.errors import ConfigError
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT
from gptcore.tools.records import JSONObject

# What the export can write, for the refusals' messages.
HOLDS = (
    "the Hugging Face export holds GPT-2's layout or Llama's (rotary, rmsnorm, swiglu; Qwen3's with qk_norm)"
)
LLAMA_FIELDS: dict[str, object] = {"norm": "rmsnorm", "mlp": "swiglu"}  # beside position 'rotary'
RMS_NORM_EPS = 1e-5  # gptcore.model.gpt's RMSNorm eps (the blocks', the final and QK-norm's)

TOP_NAMES = {
    "transformer.wte.weight": "model.embed_tokens.weight",
    "transformer.ln_f.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "ln_1": "input_layernorm",
    "ln_2": "post_attention_layernorm",
    "attn.c_proj": "self_attn.o_proj",
    "attn.q_norm": "self_attn.q_norm",
    "attn.k_norm": "self_attn.k_norm",
    "mlp.c_proj": "mlp.down_proj",
}
# The fused linears' parts, in the order their output rows are stacked.
FUSED_NAMES = {
    "attn.c_attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.c_fc": ("mlp.gate_proj", "mlp.up_proj"),
}
LAYER = re.compile(r"transformer\.h\.(\d+)\.(.+)\.(weight|bias)")


def check_llama(config: ModelConfig) -> None:
    """Refuse, in one line, a rotary model that neither Llama's nor Qwen3's layout holds."""
    fields = {key: getattr(config, key) for key in LLAMA_FIELDS}
    misfits = {key: value for key, value in fields.items() if value != LLAMA_FIELDS[key]}
    if misfits:
        named = ", ".join(f"{key} {value!r}" for key, value in misfits.items())
        raise ConfigError(f"export: position 'rotary' with {named}: {HOLDS}")
    if config.qk_norm and config.bias:  # Qwen3MLP's linears are built without biases
        raise ConfigError(
            "export: qk_norm True with bias True: Qwen3 (the Hugging Face layout with qk_norm) has no MLP "
            "biases; the export holds qk_norm with bias False only"
        )


def llama_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """The weights under Llama's (Qwen3's) names: fused linears split, the tied head left to
    `tie_word_embeddings`."""
    state = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        state.pop("lm_head.weight")  # the same tensor as transformer.wte.weight
    exported: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        exported.update(_renamed(name, tensor))
    return exported


def _renamed(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    if name in TOP_NAMES:
        return {TOP_NAMES[name]: tensor.contiguous()}
    match = LAYER.fullmatch(name)
    if match is None or (match[2] not in LAYER_NAMES and match[2] not in FUSED_NAMES):
        raise ValueError(f"export: no Llama name for the weight {name}")
    prefix, suffix = f"model.layers.{match[1]}.", match[3]
    if match[2] in LAYER_NAMES:
        return {f"{prefix}{LAYER_NAMES[match[2]]}.{suffix}": tensor.contiguous()}
    parts = FUSED_NAMES[match[2]]
    # Cloned: safetensors refuses tensors that share one storage.
    pieces = zip(parts, tensor.chunk(len(parts)), strict=True)
    return {f"{prefix}{part}.{suffix}": piece.clone() for part, piece in pieces}


def llama_config(model: GPT, end_of_text: int) -> JSONObject:
    """A `LlamaConfig` (a `Qwen3Config` with QK-norm) whose fields match the model exactly."""
    cfg = model.config
    config: JSONObject = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.mlp_width(),
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_head,  # no grouped-query attention
        "head_dim": cfg.head_dim(),
        "hidden_act": "silu",
        "max_position_embeddings": cfg.block_size,
        # The rotary settings in both spellings: transformers 5 reads `rope_parameters`, 4.x `rope_theta`
        # and `rope_scaling` at the top level (and takes 10000 for a missing rope_theta, without a word).
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "rms_norm_eps": RMS_NORM_EPS,
        "attention_bias": cfg.bias,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": end_of_text,
        "eos_token_id": end_of_text,
        "tie_word_embeddings": cfg.tie_embeddings,
        "dtype": "float32",
        "torch_dtype": "float32",  # 4.x's name for `dtype`
    }
    if cfg.qk_norm:  # Qwen3: attention biases only (check_llama), every layer full attention
        qwen3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
        return {**qwen3, **config, "use_sliding_window": False}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **config, "mlp_bias": cfg.bias}
