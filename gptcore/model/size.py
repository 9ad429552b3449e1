"""A model's size, from its shape alone: its parameters (all of them, and without the embeddings, as
Kaplan et al. count them) and the FLOPs a training token costs. A compute budget becomes tokens here,
and a scaling study reads its N from here.

FLOPs per token follow the PaLM appendix (as nanoGPT does): 6·N for the matmul weights (forward 2·N,
backward 4·N) plus 12·L·T·d for attention's scores and values, counted in full although causal kernels
skip the masked half. N counts the 2-D weights that multiply activations (the tied embedding once, as
the output head; positions, biases and norms not)."""

from __future__ import annotations

from dataclasses import dataclass

from gptcore.model.config import ModelConfig

FLOP_FORMULA = (
    "6*N_matmul - 2*N_frozen + 12*n_layer*n_embd*block_size per token (fwd+bwd; PaLM appendix B, as nanoGPT; "
    "a frozen weight's own gradient is never computed)"
)


def flops_per_token(config: ModelConfig, matmul_parameters: int, frozen_matmul_parameters: int = 0) -> int:
    """Forward 2·N, backward 4·N (activations' and weights' gradients), less the 2·N_frozen of weights
    that do not train (a LoRA fine-tune's base); attention's scores and values beside."""
    attention = 12 * config.n_layer * config.n_embd * config.block_size
    return 6 * matmul_parameters - 2 * frozen_matmul_parameters + attention


@dataclass(frozen=True)
class ModelSize:
    """What a GPT of one shape counts, under the names its training run logs them by."""

    parameter_count: int  # every distinct parameter (a tied embedding once)
    non_embedding_parameter_count: int  # without the token embedding and the position table (Kaplan's N)
    matmul_parameter_count: int  # the FLOP formula's N
    flops_per_token: int  # a training token's forward and backward

    @classmethod
    def of(cls, config: ModelConfig) -> ModelSize:
        """Counted on a model built on the meta device: its shapes, no memory and no initialisation."""
        import torch  # here, not above: a parameter file is checked without loading torch

        from gptcore.model.gpt import GPT

        with torch.device("meta"):
            model = GPT(config)
        lookups = model.transformer.wte.weight.numel()
        if "wpe" in model.transformer:
            lookups += model.transformer.wpe.weight.numel()
        matmul = model.matmul_parameter_count()
        return cls(model.parameter_count(), model.parameter_count() - lookups, matmul,
                   flops_per_token(config, matmul))  # fmt: skip

    def tokens_for(self, flops: float) -> int:
        """The training tokens `flops` buys at this size."""
        return int(flops // self.flops_per_token)

    def flops_for(self, tokens: int) -> float:
        """The training FLOPs of `tokens` tokens at this size."""
        return float(tokens) * self.flops_per_token
