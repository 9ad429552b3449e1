"""Rotary position embedding (RoPE, Su et al. 2021): each head's queries and keys rotated by their
token's absolute position, so attention scores depend on the positions' difference alone.

The cos/sin tables cover the model's window (`block_size`) in fp32, as non-persistent buffers: derived
from the config, never saved, and rebuilt in fp32 when the model moves (a cast to bfloat16 would round
the angles of far positions). The rotation pairs dimension i with i + head_dim/2 (the `rotate_half`
layout of GPT-NeoX and Llama) and runs in the queries' dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class Rotary(nn.Module):
    def __init__(self, head_dim: int, block_size: int, theta: float) -> None:
        super().__init__()
        self.head_dim, self.block_size, self.theta = head_dim, block_size, theta
        cos, sin = self._tables(None)  # on the default device (meta under `torch.device("meta")`)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _tables(self, device: torch.device | None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of every position's angles, `(block_size, head_dim / 2)`, in fp32."""
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device) / self.head_dim
        inverse_frequency = 1.0 / (self.theta**exponents)
        positions = torch.arange(self.block_size, dtype=torch.float32, device=device)
        angles = torch.outer(positions, inverse_frequency)
        return angles.cos(), angles.sin()

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Rotary:
        super()._apply(fn, recurse)
        self.cos, self.sin = self._tables(self.cos.device)  # fp32 again, on the new device
        return self

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos and sin at `positions`: `(length,)` for one offset shared by the batch (broadcast
        as `(length, half)`), or `(batch, length)`, each sequence's own (as `(batch, 1, length, half)`,
        one for every head)."""
        cos, sin = self.cos[positions], self.sin[positions]
        if positions.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]
        return cos, sin


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`x` `(batch, heads, length, head_dim)` rotated: each pair (x1, x2) by its position's angle."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
