"""The key/value cache of batched decoding: many sequences, one slot each, every one at its own position.

A server decodes the sequences of many requests together: one step runs one new token of each running
sequence through the model at once, so the weights are read once a step for all of them. The sequences
started at different times, so each slot keeps its own length: its new token's position is its length,
its query sees its own keys alone (a mask over the slot's row), and a finished sequence's slot is handed
to the next. Running sequences hold the rows `0..running-1` (`move` fills a freed row with the last
one), so a decode step reads a view of the cache, never a gathered copy.

A sequence enters by a prefill of its whole context from position 0 into its row, alone (`prefill`):
the same computation as a single sequence's first step (`gptcore.model.kv_cache`), causal, no mask.
"""

from __future__ import annotations

import torch


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
        row = self.owner.prefilling
        if row is not None:  # one sequence's context from position 0: plainly causal over its own keys
            self.keys[row, :, : keys.shape[2]] = keys[0]
            self.values[row, :, : keys.shape[2]] = values[0]
            return keys, values, None, True
        running = keys.shape[0]
        at = self.owner.lengths[:running]
        rows = torch.arange(running, device=at.device)
        self.keys[rows, :, at] = keys[:, :, 0]  # each row's one new token, at its own position
        self.values[rows, :, at] = values[:, :, 0]
        span = int(self.owner.longest) + 1
        visible = torch.arange(span, device=at.device)[None, :] <= at[:, None]  # a row sees its own keys
        mask = visible[:, None, None, :]
        return self.keys[:running, :, :span], self.values[:running, :, :span], mask, False


class SlotCache:
    """Every layer's slots and each slot's length. `prefill(row)` and `decode(running)` say what the
    model's next call does: one sequence's whole context into `row`, or one token of each of the first
    `running` rows."""

    def __init__(self, n_layer: int, block_size: int, slots: int, device: torch.device | str = "cpu") -> None:
        self.block_size, self.slots = block_size, slots
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        self.layers = [SlotLayer(self) for _ in range(n_layer)]
        self.prefilling: int | None = None
        self.running = 0
        self.longest = 0  # the longest running row's length, known without asking the device

    def prefill(self, row: int) -> SlotCache:
        self.prefilling = row
        return self

    def decode(self, running: int, longest: int) -> SlotCache:
        self.prefilling, self.running, self.longest = None, running, longest
        return self

    # --- what the model asks of a cache (gptcore.model.kv_cache) ------------------------------------

    def check_room(self, new_positions: int) -> None:
        full = new_positions if self.prefilling is not None else self.longest + new_positions
        if full > self.block_size:
            raise ValueError(f"slot cache: {full} positions exceed block_size {self.block_size}")

    def positions(self, new_positions: int, device: torch.device) -> torch.Tensor:
        if self.prefilling is not None:
            return torch.arange(new_positions, device=device)
        return self.lengths[: self.running, None]  # (running, 1): each row's next position

    def advance(self, new_positions: int) -> None:
        if self.prefilling is not None:
            self.lengths[self.prefilling] = new_positions
        else:
            self.lengths[: self.running] += 1

    # --- rows ---------------------------------------------------------------------------------------

    def move(self, source: int, target: int) -> None:
        """Row `source`'s sequence into row `target` (a finished sequence's), every layer."""
        for layer in self.layers:
            if layer.keys is not None:
                layer.keys[target] = layer.keys[source]
                layer.values[target] = layer.values[source]
        self.lengths[target] = self.lengths[source]
