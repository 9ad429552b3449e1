"""The key/value cache of batched decoding: many sequences, one slot each, every one at its own position.

A server decodes the sequences of many requests together: one step runs one new token of each running
sequence through the model at once, so the weights are read once a step for all of them. The sequences
started at different times, so each slot keeps its own length: its new token's position is its length,
its query sees its own keys alone (a mask over the slot's row), and a finished sequence's slot is handed
to the next. Decoding sequences hold the rows `0..running-1` (`move` fills a freed row with another), so
a decode step reads a view of the cache, never a gathered copy.

New prompts ride along with a decode step (`decode(running, longest, prompts)`): their tokens are packed
after the decoding rows' one token each, in one row of the model's input, so the step's matrix products
run once for all of them; inside attention the decoding tokens see their rows' keys, and each prompt's
tokens see that prompt's tokens up to themselves (a block-diagonal causal mask), their keys stored in
the prompt's row. A prompt too long for one step enters by chunks (`prefill(row, start)`): its
next chunk from `start`, its queries seeing the row's keys so far and the chunk up to themselves.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gptcore.model.kv_cache import attention_mask


class SlotLayer:
    """One layer's keys and values, `(slots, heads, block_size, head_dim)`, allocated (zeroed) on first
    use in the dtype and device of the first keys stored."""

    def __init__(self, owner: SlotCache) -> None:
        self.owner = owner
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store the call's keys and values in their rows; its queries' attention, each over what it
        may see."""
        if self.keys is None:
            _, heads, _, head_dim = k.shape
            shape = (self.owner.slots, heads, self.owner.block_size, head_dim)
            # Zeros, not empty: a row's masked positions still meet the values (weight 0 times a NaN
            # left in uninitialized memory is NaN), so they must hold numbers.
            self.keys, self.values = k.new_zeros(shape), v.new_zeros(shape)
        owner = self.owner
        if owner.prefill_row is not None:
            return self._prefill(q, k, v, owner.prefill_row)
        if owner.prompt_rows is None:  # decoding alone: `(running, heads, 1, head_dim)`, a row each
            return self._decode(q, k, v)
        decoding = owner.running  # packed: `(1, heads, running + prompt tokens, head_dim)`
        pieces = []
        if decoding:
            rowwise = [t[0, :, :decoding].transpose(0, 1).unsqueeze(2) for t in (q, k, v)]
            pieces.append(self._decode(*rowwise).squeeze(2).transpose(0, 1).unsqueeze(0))
        q, k, v = (t[:, :, decoding:] for t in (q, k, v))
        self.keys[owner.prompt_rows, :, owner.prompt_positions] = k[0].transpose(0, 1)
        self.values[owner.prompt_rows, :, owner.prompt_positions] = v[0].transpose(0, 1)
        pieces.append(F.scaled_dot_product_attention(q, k, v, attn_mask=owner.prompt_mask))
        return torch.cat(pieces, dim=2)

    def _decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        owner = self.owner
        rows, at = owner.decode_rows, owner.at
        self.keys[rows, :, at] = k[:, :, 0]  # each row's one new token, at its own position
        self.values[rows, :, at] = v[:, :, 0]
        span = owner.longest + 1
        keys, values = self.keys[: owner.running, :, :span], self.values[: owner.running, :, :span]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=owner.mask)

    def _prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, row: int) -> torch.Tensor:
        start = self.owner.start
        end = start + k.shape[2]
        self.keys[row : row + 1, :, start:end] = k
        self.values[row : row + 1, :, start:end] = v
        if start == 0:  # a prompt from position 0: plainly causal over its own keys
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        mask = attention_mask(k.shape[2], start, k.device)  # a chunk after the cached ones
        keys, values = self.keys[row : row + 1, :, :end], self.values[row : row + 1, :, :end]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


class SlotCache:
    """Every layer's slots and each slot's length. `decode(running, longest, prompts)` and
    `prefill(row, start)` say what the model's next call holds: one token of each of the first
    `running` rows and whole new prompts packed after them, or one prompt's tokens from `start` in `row`."""

    def __init__(self, n_layer: int, block_size: int, slots: int, device: torch.device | str = "cpu") -> None:
        self.block_size, self.slots = block_size, slots
        self.device = torch.device(device)
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        self.layers = [SlotLayer(self) for _ in range(n_layer)]
        self._every_row = torch.arange(slots, device=device)
        # a prefill: the row it writes (None otherwise), where its tokens begin
        self.prefill_row: int | None = None
        self.start = 0
        # a decode step: its rows, their positions and mask; prompts packed after them (None: none)
        self.running = 0
        self.longest = 0  # the longest running row's length, known without asking the device
        self.decode_rows = self._every_row[:0]
        self.at = self.lengths[:0]
        self.mask: torch.Tensor | None = None
        self.prompt_rows: torch.Tensor | None = None  # each packed prompt token's row
        self.prompt_positions = self.lengths[:0]  # and its position in that row
        self.prompt_mask: torch.Tensor | None = None
        self.prompt_lengths: list[tuple[int, int]] = []  # (row, tokens) of each packed prompt
        self.last = self.lengths[:0]  # the packed call's positions whose logits are wanted
        self._prompt_starts = (self.lengths[:0], self.lengths[:0])  # each packed prompt's row and size

    def prefill(self, row: int, start: int = 0) -> SlotCache:
        """The next call holds one prompt's tokens (a batch of one), from position `start` in `row`."""
        self.prefill_row, self.start = row, start
        return self

    def decode(self, running: int, longest: int, prompts: list[tuple[int, int]] | None = None) -> SlotCache:
        """The next call holds one token of each of the first `running` rows (`longest` is the longest of
        their lengths), then, packed after them, each of `prompts` (row, tokens) whole from position 0.
        What every layer needs is worked out here, once for the step."""
        self.prefill_row, self.running, self.longest = None, running, longest
        self.decode_rows, self.at = self._every_row[:running], self.lengths[:running]
        visible = torch.arange(longest + 1, device=self.device)[None, :] <= self.at[:, None]  # own keys
        self.mask = visible[:, None, None, :]
        self.prompt_lengths = prompts or []
        if not prompts:
            self.prompt_rows = None
            return self
        sizes = torch.tensor([size for _, size in prompts], device=self.device)
        self._prompt_starts = torch.tensor([row for row, _ in prompts], device=self.device), sizes
        self.prompt_rows = self._prompt_starts[0].repeat_interleave(sizes)
        ends = sizes.cumsum(0)
        first = (ends - sizes).repeat_interleave(sizes)  # each token's prompt's first token
        self.prompt_positions = torch.arange(int(ends[-1]), device=self.device) - first
        prompt_of = torch.arange(len(prompts), device=self.device).repeat_interleave(sizes)
        same = prompt_of[:, None] == prompt_of[None, :]
        self.prompt_mask = same & (self.prompt_positions[None, :] <= self.prompt_positions[:, None])
        self.last = torch.cat([self.decode_rows, running + ends - 1])
        return self

    # --- what the model asks of a cache (gptcore.model.kv_cache) ------------------------------------

    def check_room(self, new_positions: int) -> None:
        if self.prefill_row is not None:
            full = self.start + new_positions
        else:
            full = max([self.longest + 1, *(size for _, size in self.prompt_lengths)])
        if full > self.block_size:
            raise ValueError(f"slot cache: {full} positions exceed block_size {self.block_size}")

    def positions(self, new_positions: int, device: torch.device) -> torch.Tensor:
        if self.prefill_row is not None:
            return torch.arange(self.start, self.start + new_positions, device=device)
        if self.prompt_rows is not None:  # one packed row: each token's own position
            return torch.cat([self.at, self.prompt_positions])
        return self.at[:, None]  # (running, 1): each row's next position

    def advance(self, new_positions: int) -> None:
        if self.prefill_row is not None:
            self.lengths[self.prefill_row] = self.start + new_positions
            return
        self.lengths[: self.running] += 1
        if self.prompt_rows is not None:
            rows, sizes = self._prompt_starts
            self.lengths[rows] = sizes

    def last_positions(self, x: torch.Tensor) -> torch.Tensor:
        """Of the call's hidden states, the ones whose logits are wanted: each decoding row's and each
        packed prompt's last token (`(1, running + prompts, width)`), else each row's last position."""
        if self.prefill_row is None and self.prompt_rows is not None:
            return x[:, self.last, :]
        return x[:, -1:, :]

    # --- rows ---------------------------------------------------------------------------------------

    def move(self, source: int, target: int, used: int) -> None:
        """Row `source`'s first `used` positions into row `target`, every layer (the rest of a row is
        past its length: never seen)."""
        for layer in self.layers:
            if layer.keys is not None:
                layer.keys[target, :, :used] = layer.keys[source, :, :used]
                layer.values[target, :, :used] = layer.values[source, :, :used]
        self.lengths[target] = self.lengths[source]

    def swap(self, first: int, second: int, first_used: int, second_used: int) -> None:
        """Rows `first` and `second` trade places (their used positions), every layer."""
        for layer in self.layers:
            if layer.keys is not None:
                for table in (layer.keys, layer.values):
                    kept = table[first, :, :first_used].clone()
                    table[first, :, :second_used] = table[second, :, :second_used]
                    table[second, :, :first_used] = kept
        self.lengths[[first, second]] = self.lengths[[second, first]]
