"""The GPT's shape: what `gptcore.model.gpt.GPT` builds and every checkpoint records."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gptcore.tools.strict import Strict

# The recipe's fields at GPT-2's values: learned positions, LayerNorm, GELU at 4x, tied embeddings.
GPT2_RECIPE: dict[str, object] = {
    "position": "learned",
    "rope_theta": 10000.0,
    "norm": "layernorm",
    "qk_norm": False,
    "mlp": "gelu",
    "tie_embeddings": True,
}


class ModelConfig(Strict):
    """GPT-2 layout by default: learned positions, pre-norm LayerNorm, GELU MLP of 4x width, tied
    embeddings. The architecture options (position, norm, qk_norm, mlp, tie_embeddings) turn it into a
    modern recipe (rotary, RMSNorm, QK-norm, SwiGLU or ReLU², an untied head); their defaults are
    GPT-2's, so a default config builds the same modules, names, init and numerics as before them."""

    n_layer: int = Field(ge=1, le=256, description="transformer blocks")
    n_head: int = Field(ge=1, le=256, description="attention heads per block; they split n_embd")
    n_embd: int = Field(ge=1, le=65536, description="the residual stream's width")
    block_size: int = Field(ge=2, le=1 << 20, description="context length in tokens")
    vocab_size: int = Field(ge=257, le=1 << 32, description="rows of the (tied) embedding and output head")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="in training, after attention and MLP")
    bias: bool = Field(
        default=True, description="biases in the linear layers and LayerNorms, as GPT-2 (RMSNorm has none)"
    )
    position: Literal["learned", "rotary"] = Field(
        default="learned",
        description="how a token knows its place: 'learned', GPT-2's table of absolute positions (wpe) "
        "added to the embedding; 'rotary', no table, each head's queries and keys rotated by their "
        "absolute position (RoPE); needs an even head dimension",
    )
    rope_theta: float = Field(
        default=10000.0, gt=0.0, description="RoPE's base: the slowest rotation's period (rotary only)"
    )
    norm: Literal["layernorm", "rmsnorm"] = Field(
        default="layernorm",
        description="the blocks' and the final norm: 'layernorm' (GPT-2, with bias as `bias` says) or "
        "'rmsnorm' (scale only, no mean subtraction)",
    )
    qk_norm: bool = Field(
        default=False,
        description="RMSNorm (a learned weight per head dimension) over each head's queries and keys "
        "before the rotation and attention: bounded attention logits",
    )
    mlp: Literal["gelu", "relu2", "swiglu"] = Field(
        default="gelu",
        description="the MLP: 'gelu' (GPT-2's tanh GELU, 4x width), 'relu2' (relu(x)^2, 4x width) or "
        "'swiglu' (silu(gate) * up, width 2/3 of 4x rounded up to 64, about the same parameters)",
    )
    tie_embeddings: bool = Field(
        default=True,
        description="the output head shares the token embedding's weight (GPT-2); False: its own",
    )

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} must be a multiple of n_head {self.n_head}")
        if self.position == "rotary" and (self.n_embd // self.n_head) % 2:
            raise ValueError(
                f"position 'rotary' needs an even head dimension: n_embd {self.n_embd} / n_head "
                f"{self.n_head} = {self.n_embd // self.n_head}"
            )
        return self

    def recipe(self) -> dict[str, object]:
        """The recipe's fields that are not GPT-2's (empty: GPT-2's layout)."""
        dumped = self.model_dump()
        return {key: dumped[key] for key, value in GPT2_RECIPE.items() if dumped[key] != value}

    def recipe_name(self) -> str:
        """The recipe in a word, as runs are compared by it: 'gpt2', or its changes from GPT-2's joined by
        '+' (e.g. 'rotary+rmsnorm+qk_norm+swiglu+untied')."""
        words = {"position": str, "norm": str, "qk_norm": lambda _: "qk_norm", "mlp": str}
        words |= {"tie_embeddings": lambda _: "untied", "rope_theta": lambda theta: f"rope_theta={theta:g}"}
        changes = self.recipe()
        return "+".join(words[key](changes[key]) for key in GPT2_RECIPE if key in changes) or "gpt2"

    def identity(self) -> dict[str, object]:
        """What decides the model, as cache keys and a resume's check read it: every field, the recipe's
        only where they are not GPT-2's, so a GPT-2 model's identity is what it was before the recipe's
        fields existed (its cached stages and its checkpoints stay valid)."""
        return {
            key: value for key, value in self.model_dump().items() if key not in GPT2_RECIPE
        } | self.recipe()

    def differences(self, other: ModelConfig) -> dict[str, tuple[object, object]]:
        """The fields in which `other` builds another model than this config, as {field: (this one's,
        other's)}: every field but dropout, a training setting that no weight depends on."""
        mine, theirs = self.model_dump(exclude={"dropout"}), other.model_dump(exclude={"dropout"})
        return {key: (mine[key], theirs[key]) for key in mine if mine[key] != theirs[key]}

    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def mlp_width(self) -> int:
        """The MLP's hidden width: 4 * n_embd, or for SwiGLU (three matrices, not two) 2/3 of that
        rounded up to a multiple of 64, so the MLP's parameters stay about the same."""
        if self.mlp != "swiglu":
            return 4 * self.n_embd
        return -(-8 * self.n_embd // 192) * 64  # ceil(2/3 * 4 * n_embd / 64) * 64
