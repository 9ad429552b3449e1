"""The size dial: one number, the depth, from which a GPT's shape and its learning rate follow, so a
scaling study (and the next iteration's parameter file) moves one knob instead of four.

- width = depth x ASPECT (nanochat's aspect ratio, 64 here as there): depth and width grow together, the
  shape most studies find close to the best for a given parameter count;
- heads of HEAD_DIM (64) each: width / 64 heads, so attention's resolution stays that of GPT-2's heads;
- the AdamW rates scale as sqrt(REFERENCE_WIDTH / width): a wider model's matrices take smaller steps
  (muP gives 1/width for hidden matrices under Adam; the square root, as nanochat scales its embedding
  rates, is the gentler rule, anchored where the parameter files' rates were tuned: iteration 1's width).
  Muon's rate is left as it is: its update is orthogonalised and scaled by the matrix's own shape, the
  width already in it.

Depth 4 is iteration 1's model in either recipe (4 x 256, 4 heads): `gpt_first_cpu` and
`gpt_first_cpu_modern` are points on the dial, and keep their names and cache keys as profiles."""

from __future__ import annotations

import math
from typing import Literal

from gptcore.model.config import ModelConfig

ASPECT = 64  # width per block
HEAD_DIM = 64
REFERENCE_WIDTH = 256  # the width the parameter files' AdamW rates were tuned at (iteration 1's)

Recipe = Literal["gpt2", "modern"]
# The fields each recipe sets (gptcore.model.config's GPT-2 defaults, or the modern one of
# docs/training.md's "Two recipes": rotary, RMSNorm, QK-norm, SwiGLU, no biases, the head tied).
RECIPES: dict[str, dict[str, object]] = {
    "gpt2": {"bias": True, "position": "learned", "norm": "layernorm", "qk_norm": False, "mlp": "gelu"},
    "modern": {"bias": False, "position": "rotary", "norm": "rmsnorm", "qk_norm": True, "mlp": "swiglu"},
}


def width(depth: int) -> int:
    return depth * ASPECT


def architecture(
    depth: int, recipe: Recipe, vocab_size: int, block_size: int, dropout: float = 0.0
) -> ModelConfig:
    """The GPT of `depth` blocks in `recipe`, over this vocabulary and context."""
    shape = {"n_layer": depth, "n_embd": width(depth), "n_head": max(1, width(depth) // HEAD_DIM)}
    return ModelConfig(
        **shape, **RECIPES[recipe], vocab_size=vocab_size, block_size=block_size, dropout=dropout,
        tie_embeddings=True,
    )  # fmt: skip


def recipe_of(config: ModelConfig) -> Recipe:
    """The dial's recipe a shape is closest to: modern when its positions are rotary, else GPT-2's."""
    return "modern" if config.position == "rotary" else "gpt2"


def learning_rate_scale(depth: int) -> float:
    """What the AdamW rates are multiplied by at this depth (1 at iteration 1's width)."""
    return math.sqrt(REFERENCE_WIDTH / width(depth))


def name(depth: int, recipe: Recipe) -> str:
    return f"{recipe}-d{depth}"
