"""The GPT: a decoder-only transformer in the GPT-2 layout.

Parameter names follow GPT-2 (`transformer.wte`, `transformer.h.N.attn.c_attn`, ...), so an export to the
Hugging Face GPT-2 layout is a renaming (and a transpose of the Conv1D weights), not a conversion. The
activation is GELU with the tanh approximation, GPT-2's `gelu_new`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from gptcore.model.config import ModelConfig
from gptcore.model.cross_entropy import cross_entropy
from gptcore.model.kv_cache import KVCache, LayerCache
from gptcore.model.slot_cache import SlotCache, SlotLayer


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, cache: LayerCache | SlotLayer | None = None) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        shape = (batch, length, self.n_head, width // self.n_head)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        mask, causal = None, True
        if cache is not None:  # the keys and values of every position so far, and who sees which
            k, v, mask, causal = cache.attend(k, v)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=causal
        )
        y = y.transpose(1, 2).contiguous().view(batch, length, width)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cache: LayerCache | SlotLayer | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache)
        return x + self.mlp(self.ln_2(x))


INIT_STD = 0.02  # GPT-2's initial standard deviation of every weight matrix and embedding
# With activation checkpointing the output head and loss run over this many tokens at a time, each
# piece recomputed in the backward pass, so a batch's whole tokens x vocabulary logits never exist.
LOSS_CHUNK_TOKENS = 512


class GPT(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(config.vocab_size, config.n_embd),
                "wpe": nn.Embedding(config.block_size, config.n_embd),
                "drop": nn.Dropout(config.dropout),
                "h": nn.ModuleList(Block(config) for _ in range(config.n_layer)),
                "ln_f": nn.LayerNorm(config.n_embd, bias=config.bias),
            }
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied input and output embeddings
        # Recompute each block in the backward pass instead of keeping its activations (a runtime
        # choice, not the architecture's: the same weights and losses, less memory, about a third
        # more compute).
        self.activation_checkpointing = False
        self.apply(self._init_weights)
        # GPT-2's scaled init: each residual projection adds to the stream 2 * n_layer times.
        residual_std = INIT_STD / math.sqrt(2 * config.n_layer)
        for name, parameter in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(parameter, mean=0.0, std=residual_std)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)

    def parameter_count(self) -> int:
        """Every distinct parameter, the tied embedding once, positions included."""
        return sum(p.numel() for p in self.parameters())

    def matmul_parameter_count(self) -> int:
        """Weights that take part in a matmul per token (the FLOP formula's N): the 2-D weights but
        the position table, which is a lookup. The tied embedding counts once, as the output head."""
        return sum(p.numel() for p in self._matmul_weights())

    def frozen_matmul_parameter_count(self) -> int:
        """Of those, the ones that do not train (a LoRA fine-tune's base): their backward computes the
        activations' gradients alone, not their own."""
        return sum(p.numel() for p in self._matmul_weights() if not p.requires_grad)

    def _matmul_weights(self) -> list[nn.Parameter]:
        wpe = self.transformer.wpe.weight
        return [p for p in self.parameters() if p.dim() == 2 and p is not wpe]

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        cache: KVCache | SlotCache | None = None,
        loss_only: bool = False,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Logits for every position with the mean cross-entropy when targets are given; else the
        logits of the last position only (all generation needs). With a `cache`, `idx` holds the
        positions after the cached ones, whose keys and values are stored there too. With `loss_only`
        (evaluation), and when training with activation checkpointing, the loss alone (None for the
        logits): one `LOSS_CHUNK_TOKENS` piece of logits at a time, never the batch's whole."""
        length = idx.shape[1]
        if cache is not None:
            cache.check_room(length)
            positions = cache.positions(length, idx.device)  # each row's own, in a batch of sequences
        elif length > self.config.block_size:
            raise ValueError(f"sequence of {length} tokens exceeds block_size {self.config.block_size}")
        else:
            positions = torch.arange(length, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(positions))
        recompute = self.activation_checkpointing and cache is None and torch.is_grad_enabled()
        for index, block in enumerate(self.transformer.h):
            if recompute:  # non-reentrant: keeps the RNG state, so dropout masks replay exactly
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x, cache.layers[index] if cache is not None else None)
        if cache is not None:
            cache.advance(length)
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, -1:, :]), None
        if recompute or loss_only:
            pieces = self._chunked_loss(x.view(-1, x.size(-1)), targets.reshape(-1), torch.is_grad_enabled())
            return None, pieces
        logits = self.lm_head(x)
        loss = cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def _chunked_loss(self, x: torch.Tensor, targets: torch.Tensor, recompute: bool) -> torch.Tensor:
        """The mean cross-entropy over `LOSS_CHUNK_TOKENS`-token pieces, with `recompute` each piece's
        logits recomputed in the backward pass: one piece's logits alive at a time, not the batch's."""
        total = x.new_zeros((), dtype=torch.float32)
        for start in range(0, targets.numel(), LOSS_CHUNK_TOKENS):
            piece = slice(start, start + LOSS_CHUNK_TOKENS)
            if recompute:
                summed = checkpoint(self._summed_loss, x[piece], targets[piece], use_reentrant=False)
            else:
                summed = self._summed_loss(x[piece], targets[piece])
            total = total + summed
        return total / targets.numel()

    def _summed_loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return cross_entropy(self.lm_head(x), targets) * targets.numel()


def optimizer_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices (linear weights, embeddings) only; biases and norms go undecayed."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
