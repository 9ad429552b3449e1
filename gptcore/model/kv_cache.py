"""The key/value cache of sampling: each layer's keys and values of the tokens seen so far, so a new token
costs one position's forward pass instead of the whole context's.

What the model asks of a cache (this one, or `gptcore.model.slot_cache.SlotCache`, many sequences at
their own positions): `check_room(n)`, `positions(n, device)` of the new tokens, each layer's
`attention(q, k, v)` (stores the new keys and values; the new queries' attention over every key they
may see), `advance(n)` once every layer has stored the step, and `last_positions(x)`, the hidden states
whose logits are wanted.

The cache holds at most `block_size` positions, the model's window. Positions are absolute (the `wpe`
table, or rotary keys stored already rotated), so a full cache cannot slide: the sampler starts a new
one from the context's last tokens (see `gptcore.generate.sample`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class LayerCache:
    """One layer's keys and values, `(batch, heads, block_size, head_dim)`, allocated on first use in the
    dtype and device of the first keys stored (so autocast and the model's device decide, not the caller)."""

    def __init__(self, owner: KVCache) -> None:
        self.owner = owner
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def store(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's keys and values after the cached ones; every key and value so far."""
        if self.keys is None:
            batch, heads, _, head_dim = keys.shape
            shape = (batch, heads, self.owner.block_size, head_dim)
            self.keys = keys.new_empty(shape)
            self.values = values.new_empty(shape)
        start, end = self.owner.length, self.owner.length + keys.shape[2]
        self.keys[:, :, start:end] = keys
        self.values[:, :, start:end] = values
        return self.keys[:, :, :end], self.values[:, :, :end]

    def attend(
        self, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, bool]:
        """Store this step's keys and values; what its queries attend to: every key and value so far,
        the mask, and whether it is plainly causal (a prefill; later queries see the cached keys)."""
        cached = self.owner.length
        keys, values = self.store(keys, values)
        return keys, values, attention_mask(keys.shape[2] - cached, cached, keys.device), cached == 0

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store the step's keys and values; its queries' attention over every key so far."""
        keys, values, mask, causal = self.attend(k, v)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=causal)


class KVCache:
    """Every layer's cache and the number of positions they hold (`length`), advanced by the model once
    all its layers have stored a step."""

    def __init__(self, n_layer: int, block_size: int) -> None:
        self.block_size = block_size
        self.length = 0
        self.layers = [LayerCache(self) for _ in range(n_layer)]

    @property
    def full(self) -> bool:
        return self.length >= self.block_size

    def check_room(self, new_positions: int) -> None:
        if self.length + new_positions > self.block_size:
            raise ValueError(
                f"kv cache: {self.length} cached + {new_positions} new positions exceed block_size "
                f"{self.block_size}; start a new cache from the context's last tokens"
            )

    def positions(self, new_positions: int, device: torch.device) -> torch.Tensor:
        return torch.arange(self.length, self.length + new_positions, device=device)

    def advance(self, new_positions: int) -> None:
        self.length += new_positions

    def last_positions(self, x: torch.Tensor) -> torch.Tensor:
        """Of the call's hidden states, the last position's: the one whose logits sampling needs."""
        return x[:, -1:, :]


def attention_mask(new_positions: int, cached: int, device: torch.device) -> torch.Tensor | None:
    """The boolean mask of `new_positions` queries over `cached + new_positions` keys: query i sees the
    cached keys and the new ones up to itself. None where `is_causal` or no mask says the same."""
    if cached == 0 or new_positions == 1:
        return None  # a prefill is plainly causal; one new token sees every key
    keys = cached + new_positions
    return torch.ones(new_positions, keys, dtype=torch.bool, device=device).tril(diagonal=cached)
