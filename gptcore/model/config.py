"""The GPT's shape: what `gptcore.model.gpt.GPT` builds and every checkpoint records."""

from __future__ import annotations

from pydantic import Field, model_validator

from gptcore.tools.strict import Strict


class ModelConfig(Strict):
    """GPT-2 layout: learned positions, pre-norm LayerNorm, tied embeddings."""

    n_layer: int = Field(ge=1, le=256, description="transformer blocks")
    n_head: int = Field(ge=1, le=256, description="attention heads per block; they split n_embd")
    n_embd: int = Field(ge=1, le=65536, description="the residual stream's width")
    block_size: int = Field(ge=2, le=1 << 20, description="context length in tokens")
    vocab_size: int = Field(ge=257, le=1 << 32, description="rows of the (tied) embedding and output head")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="in training, after attention and MLP")
    bias: bool = Field(default=True, description="biases in the linear layers and LayerNorms, as GPT-2")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} must be a multiple of n_head {self.n_head}")
        return self
