"""The key/value cache of batched decoding: many sequences, one slot each, every one at its own position.

A server decodes the sequences of many requests together: one step runs one new token of each running
sequence through the model at once, so the weights are read once a step for all of them. The sequences
started at different times, so each slot keeps its own length: its new token's position is its length,
its query sees its own keys alone (a mask over the slot's row), and a finished sequence's slot is handed
to the next. Decoding sequences hold the rows `0..running-1` (`move` fills a freed row with another), so
a decode step reads a view of the cache, never a gathered copy.

Prompts enter by a prefill into their rows (`prefill(rows, start, lengths)`): several prompts from
position 0 at once, right-padded to the longest (plainly causal: a real position never sees the padding
after it, and the padding's keys lie past the row's length, where decoding overwrites them), or one
long prompt's next chunk from `start`, its queries seeing the row's cached keys and the chunk up to
themselves (`gptcore.model.kv_cache.attention_mask`).
"""

from __future__ import annotations

import torch

from gptcore.model.kv_cache import attention_mask


class SlotLayer:
    """One layer's keys and values, `(slots, heads, block_size, head_dim)`, allocated (zeroed) on first
    use in the dtype and device of the first keys stored."""

    def __init__(self, owner: SlotCache) -> None:
        self.owner = owner
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def attend(
        self, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, bool]:
        """Store the step's keys and values in their rows; what the step's queries attend to."""
        if self.keys is None:
            _, heads, _, head_dim = keys.shape
            shape = (self.owner.slots, heads, self.owner.block_size, head_dim)
            # Zeros, not empty: a row's masked positions still meet the values (weight 0 times a NaN
            # left in uninitialized memory is NaN), so they must hold numbers.
            self.keys, self.values = keys.new_zeros(shape), values.new_zeros(shape)
        owner = self.owner
        if owner.prefill_rows is not None:
            rows, start, end = owner.prefill_rows, owner.start, owner.start + keys.shape[2]
            self.keys[rows, :, start:end] = keys
            self.values[rows, :, start:end] = values
            if start == 0:  # whole prompts from position 0: plainly causal over their own keys
                return keys, values, None, True
            mask = attention_mask(keys.shape[2], start, keys.device)  # a chunk after the cached ones
            return self.keys[rows, :, :end], self.values[rows, :, :end], mask, False
        rows, at = owner.decode_rows, owner.at
        self.keys[rows, :, at] = keys[:, :, 0]  # each row's one new token, at its own position
        self.values[rows, :, at] = values[:, :, 0]
        span = owner.longest + 1
        return self.keys[: owner.running, :, :span], self.values[: owner.running, :, :span], owner.mask, False


class SlotCache:
    """Every layer's slots and each slot's length. `prefill(rows, start, lengths)` and `decode(running,
    longest)` say what the model's next call does: prompts into `rows` from `start`, or one token of
    each of the first `running` rows."""

    def __init__(self, n_layer: int, block_size: int, slots: int, device: torch.device | str = "cpu") -> None:
        self.block_size, self.slots = block_size, slots
        self.device = torch.device(device)
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        self.layers = [SlotLayer(self) for _ in range(n_layer)]
        self._every_row = torch.arange(slots, device=device)
        self.prefill_rows: torch.Tensor | None = None  # the rows a prefill writes, None while decoding
        self.start = 0  # where a prefill's tokens begin in their rows
        self.ends: torch.Tensor | None = None  # each prefilled row's real tokens in this call
        self.running = 0
        self.longest = 0  # the longest running row's length, known without asking the device
        self.decode_rows = self._every_row[:0]
        self.at = self.lengths[:0]
        self.mask: torch.Tensor | None = None

    def prefill(self, rows: list[int], start: int = 0, lengths: list[int] | None = None) -> SlotCache:
        """The next call holds `rows`' prompts from position `start`, right-padded: `lengths[i]` real
        tokens in row `rows[i]` (all of the call's tokens when not given)."""
        self.prefill_rows = torch.tensor(rows, device=self.device)
        self.start = start
        self.ends = None if lengths is None else torch.tensor(lengths, device=self.device)
        return self

    def decode(self, running: int, longest: int) -> SlotCache:
        """The next call holds one token of each of the first `running` rows; `longest` is the longest
        of their lengths. What every layer needs is worked out here, once for the step."""
        self.prefill_rows, self.running, self.longest = None, running, longest
        self.decode_rows, self.at = self._every_row[:running], self.lengths[:running]
        visible = torch.arange(longest + 1, device=self.device)[None, :] <= self.at[:, None]  # own keys
        self.mask = visible[:, None, None, :]
        return self

    # --- what the model asks of a cache (gptcore.model.kv_cache) ------------------------------------

    def check_room(self, new_positions: int) -> None:
        full = self.start + new_positions if self.prefill_rows is not None else self.longest + new_positions
        if full > self.block_size:
            raise ValueError(f"slot cache: {full} positions exceed block_size {self.block_size}")

    def positions(self, new_positions: int, device: torch.device) -> torch.Tensor:
        if self.prefill_rows is not None:
            return torch.arange(self.start, self.start + new_positions, device=device)
        return self.at[:, None]  # (running, 1): each row's next position

    def advance(self, new_positions: int) -> None:
        if self.prefill_rows is not None:
            real = self.ends if self.ends is not None else new_positions
            self.lengths[self.prefill_rows] = self.start + real
        else:
            self.lengths[: self.running] += 1

    def last_positions(self, x: torch.Tensor) -> torch.Tensor:
        """Of the call's hidden states, each row's last real position: the one whose logits it needs."""
        if self.prefill_rows is None or self.ends is None:
            return x[:, -1:, :]
        return x[torch.arange(x.shape[0], device=x.device), self.ends - 1][:, None, :]

    # --- rows ---------------------------------------------------------------------------------------

    def move(self, source: int, target: int, used: int) -> None:
        """Row `source`'s first `used` positions into row `target`, every layer (the rest of a row is
        past its length: never seen)."""
        for layer in self.layers:
            if layer.keys is not None:
                layer.keys[target, :, :used] = layer.keys[source, :, :used]
                layer.values[target, :, :used] = layer.values[source, :, :used]
        self.lengths[target] = self.lengths[source]
