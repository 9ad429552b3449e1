"""The GPT: a decoder-only transformer in the GPT-2 layout, or a modern recipe beside it.

Parameter names follow GPT-2 (`transformer.wte`, `transformer.h.N.attn.c_attn`, ...), so an export to the
Hugging Face GPT-2 layout is a renaming (and a transpose of the Conv1D weights), not a conversion. The
default config is GPT-2 exactly (learned positions, LayerNorm, tanh-GELU MLP, tied head); its options
(`ModelConfig.position`, `norm`, `qk_norm`, `mlp`, `tie_embeddings`) swap in rotary positions
(`gptcore.model.rotary`), RMSNorm, QK-norm, ReLU² or SwiGLU (`gptcore.model.mlp`) and an untied head,
under the same names wherever a layer exists in both.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from gptcore.model.config import ModelConfig
from gptcore.model.cross_entropy import cross_entropy, trained_count
from gptcore.model.kv_cache import KVCache, LayerCache
from gptcore.model.mlp import MLP
from gptcore.model.rotary import Rotary, rotate
from gptcore.model.slot_cache import SlotCache, SlotLayer

Rope = tuple[torch.Tensor, torch.Tensor]  # the cos and sin at the step's positions (gptcore.model.rotary)


def norm(config: ModelConfig, width: int) -> nn.Module:
    """The config's norm over `width`. RMSNorm's eps is LayerNorm's, not torch's default (the dtype's
    machine epsilon, 1/128 in bfloat16, large next to a small mean square)."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(width, eps=1e-5)
    return nn.LayerNorm(width, bias=config.bias)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        if config.qk_norm:  # one weight per head dimension, shared by the heads
            self.q_norm = nn.RMSNorm(config.head_dim(), eps=1e-5)
            self.k_norm = nn.RMSNorm(config.head_dim(), eps=1e-5)
        self.qk_norm = config.qk_norm

    def forward(
        self, x: torch.Tensor, cache: LayerCache | SlotLayer | None = None, rope: Rope | None = None
    ) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        shape = (batch, length, self.n_head, width // self.n_head)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:  # rotated before the cache stores the keys: each at its own position
            q, k = rotate(q, *rope), rotate(k, *rope)
        if cache is not None:  # stores this call's keys and values; each query sees what it may
            y = cache.attention(q, k, v)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
            )
        y = y.transpose(1, 2).contiguous().view(batch, length, width)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = norm(config, config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = norm(config, config.n_embd)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, cache: LayerCache | SlotLayer | None = None, rope: Rope | None = None
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache, rope)
        return x + self.mlp(self.ln_2(x))


INIT_STD = 0.02  # GPT-2's initial standard deviation of every weight matrix and embedding
# With activation checkpointing the output head and loss run over this many tokens at a time, each
# piece recomputed in the backward pass, so a batch's whole tokens x vocabulary logits never exist.
LOSS_CHUNK_TOKENS = 512


class GPT(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        # The modules in GPT-2's order: their construction draws from the random generator, so the
        # default config's init is the same draw for draw.
        layers: dict[str, nn.Module] = {"wte": nn.Embedding(config.vocab_size, config.n_embd)}
        if config.position == "learned":
            layers["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        layers["drop"] = nn.Dropout(config.dropout)
        layers["h"] = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        layers["ln_f"] = norm(config, config.n_embd)
        self.transformer = nn.ModuleDict(layers)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight  # tied input and output embeddings
        self.rotary = None  # no parameters: the cos/sin tables of rotary positions
        if config.position == "rotary":
            self.rotary = Rotary(config.head_dim(), config.block_size, config.rope_theta)
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
        """Every distinct parameter: a tied embedding once, an untied head beside it, the learned
        position table when there is one (rotary positions have no parameters)."""
        return sum(p.numel() for p in self.parameters())

    def matmul_parameter_count(self) -> int:
        """Weights that take part in a matmul per token (the FLOP formula's N): the 2-D weights but
        the lookups (the position table; the token embedding when the head is untied, which then
        counts on its own). A tied embedding counts once, as the output head."""
        return sum(p.numel() for p in self._matmul_weights())

    def frozen_matmul_parameter_count(self) -> int:
        """Of those, the ones that do not train (a LoRA fine-tune's base): their backward computes the
        activations' gradients alone, not their own."""
        return sum(p.numel() for p in self._matmul_weights() if not p.requires_grad)

    def _matmul_weights(self) -> list[nn.Parameter]:
        lookups = [self.transformer.wpe.weight] if "wpe" in self.transformer else []
        if self.lm_head.weight is not self.transformer.wte.weight:
            lookups.append(self.transformer.wte.weight)
        return [p for p in self.parameters() if p.dim() == 2 and all(p is not q for q in lookups)]

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
        x = self.transformer.wte(idx)
        rope = None
        if self.rotary is not None:  # positions rotate the queries and keys, in every block
            rope = self.rotary(positions)
        else:
            x = x + self.transformer.wpe(positions)
        x = self.transformer.drop(x)
        recompute = self.activation_checkpointing and cache is None and torch.is_grad_enabled()
        for index, block in enumerate(self.transformer.h):
            if recompute:  # non-reentrant: keeps the RNG state, so dropout masks replay exactly
                x = checkpoint(block, x, None, rope, use_reentrant=False)
            else:
                x = block(x, cache.layers[index] if cache is not None else None, rope)
        if cache is not None:
            cache.advance(length)
        if targets is None:  # each row's last position (a padded prefill's rows end where they end)
            last = cache.last_positions(x) if cache is not None else x[:, -1:, :]
            return self.lm_head(self.transformer.ln_f(last)), None
        x = self.transformer.ln_f(x)
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
        return total / trained_count(targets).clamp(min=1)

    def _summed_loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return cross_entropy(self.lm_head(x), targets) * trained_count(targets)


def optimizer_groups(model: nn.Module, weight_decay: float, exclude: set[int] = frozenset()) -> list[dict]:
    """Weight decay on matrices (linear weights, embeddings) only; biases and norms go undecayed. The
    parameters whose ids are in `exclude` are left out (another optimizer trains them: Muon)."""
    trained = [p for p in model.parameters() if p.requires_grad and id(p) not in exclude]
    decay = [p for p in trained if p.dim() >= 2]
    no_decay = [p for p in trained if p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
