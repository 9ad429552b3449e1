"""Which kernel `scaled_dot_product_attention` runs for a model on a device and precision: flash,
efficient, cudnn or math. Asked of torch's own dispatcher (`torch._fused_sdp_choice`) with tensors of
the model's head layout, so the answer is the kernel training will use, not a guess from the GPU's name.
"""

from __future__ import annotations

import torch

from gptcore.model.config import ModelConfig

NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def attention_backend(model: ModelConfig, device: str, dtype: torch.dtype) -> str:
    """The kernel a training step's causal attention runs with (one sequence of `block_size`)."""
    head = model.n_embd // model.n_head
    try:
        q = torch.zeros(1, model.n_head, model.block_size, head, device=device, dtype=dtype)
        choice = int(torch._fused_sdp_choice(q, q, q, None, model.dropout, True))
    except (AttributeError, RuntimeError, TypeError) as error:  # a build without the dispatcher's answer
        return f"unknown ({type(error).__name__})"
    return NAMES.get(choice, f"unknown ({choice})")
