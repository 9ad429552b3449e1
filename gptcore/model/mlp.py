"""The blocks' MLP: GPT-2's GELU (tanh approximation, `gelu_new`), ReLU² (Primer, So et al. 2021) or
SwiGLU (Shazeer 2020). Every variant keeps the two linear names `c_fc` and `c_proj`, so the export and
LoRA targets (`mlp.c_fc`, `mlp.c_proj`) find them: SwiGLU's gate and up projections are one fused
`c_fc` of twice the hidden width."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gptcore.model.config import ModelConfig


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.kind = config.mlp
        hidden = config.mlp_width()
        fused = 2 if self.kind == "swiglu" else 1  # gate and up side by side
        self.c_fc = nn.Linear(config.n_embd, fused * hidden, bias=config.bias)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)
        if self.kind == "gelu":
            h = F.gelu(h, approximate="tanh")
        elif self.kind == "relu2":
            h = F.relu(h).square()
        else:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        return self.dropout(self.c_proj(h))
