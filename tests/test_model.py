"""The GPT model: GPT-2 layout and names, tied embeddings, causality, exact profile sizes."""

from __future__ import annotations

import pytest
import torch

from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT, optimizer_groups
from tasks.params.loading import load_profile

TINY = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=300)


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("gpt_first_cpu", 5_322_240),
        ("gpt_first_cpu_modern", 5_311_232),  # no position table, no biases; SwiGLU at 704 wide
        ("gpt_42m", 41_938_560),
        ("gpt_100m", 98_425_344),
    ],
)
def test_profile_parameter_counts_come_from_the_built_model(profile: str, expected: int) -> None:
    with torch.device("meta"):  # shapes only: no memory, no init cost
        model = GPT(load_profile(profile).architecture)
    assert model.parameter_count() == expected


def test_first_cpu_profile_has_the_issue_shape() -> None:
    arch = load_profile("gpt_first_cpu").architecture
    assert (arch.n_layer, arch.n_head, arch.n_embd, arch.block_size, arch.vocab_size) == (
        4,
        4,
        256,
        256,
        8192,
    )


def test_parameter_names_follow_gpt2_and_the_head_is_tied() -> None:
    model = GPT(TINY)
    names = set(model.state_dict())
    for name in [
        "transformer.wte.weight",
        "transformer.wpe.weight",
        "transformer.h.0.ln_1.weight",
        "transformer.h.0.attn.c_attn.weight",
        "transformer.h.0.attn.c_proj.bias",
        "transformer.h.1.ln_2.bias",
        "transformer.h.1.mlp.c_fc.weight",
        "transformer.h.1.mlp.c_proj.weight",
        "transformer.ln_f.weight",
        "lm_head.weight",
    ]:
        assert name in names
    assert model.lm_head.weight is model.transformer.wte.weight


def test_residual_projections_get_the_scaled_init() -> None:
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=8, n_head=2, n_embd=128, block_size=16, vocab_size=300))
    c_proj = model.transformer.h[0].mlp.c_proj.weight.std().item()
    c_fc = model.transformer.h[0].mlp.c_fc.weight.std().item()
    assert c_fc == pytest.approx(0.02, rel=0.05)
    assert c_proj == pytest.approx(0.02 / 4.0, rel=0.05)  # 0.02 / sqrt(2 * 8)


def test_attention_is_causal() -> None:
    torch.manual_seed(0)
    model = GPT(TINY).eval()
    idx = torch.randint(0, 300, (1, 16))
    changed = idx.clone()
    changed[0, 10] = (idx[0, 10] + 1) % 300
    logits, _ = model(idx, idx)
    logits_changed, _ = model(changed, changed)
    assert torch.equal(logits[0, :10], logits_changed[0, :10])
    assert not torch.equal(logits[0, 10:], logits_changed[0, 10:])


def test_loss_starts_near_uniform_and_inference_returns_last_position() -> None:
    torch.manual_seed(0)
    model = GPT(TINY)
    idx = torch.randint(0, 300, (4, 16))
    logits, loss = model(idx, torch.randint(0, 300, (4, 16)))
    assert logits.shape == (4, 16, 300)
    assert loss.item() == pytest.approx(torch.log(torch.tensor(300.0)).item(), rel=0.05)
    last, none = model(idx)
    assert last.shape == (4, 1, 300) and none is None
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_weight_decay_applies_to_matrices_only() -> None:
    decay, no_decay = optimizer_groups(GPT(TINY), 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"])
    assert all(p.dim() == 1 for p in no_decay["params"])
    total = sum(p.numel() for group in (decay, no_decay) for p in group["params"])
    assert total == GPT(TINY).parameter_count()
