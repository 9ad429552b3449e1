"""LoRA on the model's own linear layers: it starts at the base model, trains only the adapters, and
merges into a plain model equal to base + B·A·alpha/r."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from gptcore.errors import ConfigError
from gptcore.finetune.config import LoRAConfig
from gptcore.finetune.lora import (
    LoRALinear,
    adapter_state_dict,
    apply_lora,
    load_adapter,
    lora_layers,
    merge_lora,
    trainable_parameters,
)
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT

TINY = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=300, dropout=0.0)
EVERY = LoRAConfig(
    r=4, alpha=8.0, dropout=0.0, targets=["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
)


def base_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(TINY).eval()


def tokens(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    window = torch.randint(
        0, TINY.vocab_size, (4, TINY.block_size + 1), generator=torch.Generator().manual_seed(seed)
    )
    return window[:, :-1], window[:, 1:]


def trained(model: GPT, steps: int = 5) -> GPT:
    """A few AdamW steps on random tokens, over what the model leaves trainable."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for step in range(steps):
        _, loss = model(*tokens(step))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


def test_an_adapted_model_starts_exactly_at_the_base_model() -> None:
    base, adapted = base_model(), base_model()
    names = apply_lora(adapted, EVERY)
    assert len(names) == 4 * TINY.n_layer and names[0] == "transformer.h.0.attn.c_attn"
    x, _ = tokens()
    with torch.no_grad():
        difference = (adapted(x)[0] - base(x)[0]).abs().max()
    assert difference < 1e-6, "B starts at zero: the update is zero (the sums' rounding aside)"


def test_only_the_adapters_train_and_the_base_weights_stay_as_they_were() -> None:
    model = base_model()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    apply_lora(model, LoRAConfig(r=4, targets=["attn.c_attn", "mlp.c_fc"]))
    count, share = trainable_parameters(model)
    n = TINY.n_embd
    assert count == TINY.n_layer * (4 * (n + 3 * n) + 4 * (n + 4 * n)), "r x (in + out) a layer"
    assert 0 < share < 0.1
    trained(model)
    for name, parameter in model.named_parameters():
        if name.endswith((".lora_a", ".lora_b")):
            continue
        original = name.replace(".base.", ".")
        assert torch.equal(parameter, before[original]), f"{name} changed"
    assert all(layer.lora_b.abs().sum() > 0 for _, layer in lora_layers(model)), "B moved off zero"


def test_merging_gives_the_base_plus_b_a_scaled_and_the_same_outputs() -> None:
    model = base_model()
    apply_lora(model, EVERY)
    trained(model)
    x, _ = tokens()
    layers = dict(lora_layers(model))
    expected = {
        name: (layer.base.weight + layer.lora_b @ layer.lora_a * (EVERY.alpha / EVERY.r)).detach().clone()
        for name, layer in layers.items()
    }
    with torch.no_grad():
        adapted_logits = model(x)[0]
    merge_lora(model)
    assert (
        lora_layers(model) == [] and sum(p.numel() for p in model.parameters()) == GPT(TINY).parameter_count()
    )
    for name, weight in expected.items():
        assert torch.allclose(model.get_submodule(name).weight, weight, atol=1e-6), name
    with torch.no_grad():
        assert torch.allclose(model(x)[0], adapted_logits, atol=1e-5)
    assert set(model.state_dict()) == set(GPT(TINY).state_dict()), "a plain model of the base's shape"


def test_the_adapter_alone_reproduces_the_adapted_model_on_a_fresh_base() -> None:
    model = base_model()
    apply_lora(model, EVERY)
    trained(model)
    adapter = adapter_state_dict(model)
    assert set(adapter) == {
        f"{name}.{part}" for name, _ in lora_layers(model) for part in ("lora_a", "lora_b")
    }
    fresh = base_model()
    apply_lora(fresh, EVERY)
    load_adapter(fresh, adapter)
    x, _ = tokens()
    with torch.no_grad():
        assert torch.equal(fresh(x)[0], model(x)[0])
    other = base_model()
    apply_lora(other, LoRAConfig(r=4, targets=["mlp.c_fc"]))
    with pytest.raises(ConfigError, match=r"adapt it with the settings the adapter was trained with"):
        load_adapter(other, adapter)


def test_dropout_acts_on_the_adapter_in_training_only() -> None:
    layer = LoRALinear(torch.nn.Linear(8, 8), r=2, alpha=4.0, dropout=0.5)
    torch.nn.init.normal_(layer.lora_b)
    x = torch.randn(3, 8)
    layer.eval()
    assert torch.equal(layer(x), layer(x)) and torch.allclose(layer(x), layer.merged()(x), atol=1e-6)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (LoRAConfig(r=33, targets=["attn.c_attn"]), r"finetune.lora.r: value 33 is not allowed: at most 32"),
        (LoRAConfig(r=2, targets=["attn.c_attn"]), None),
    ],
)
def test_a_rank_above_a_layers_smaller_side_is_refused(settings: LoRAConfig, message: str | None) -> None:
    model = base_model()
    if message is None:
        adapted = apply_lora(model, settings)
        blocks = [f"transformer.h.{i}.attn.c_attn" for i in range(model.config.n_layer)]
        assert adapted == blocks == [name for name, _ in lora_layers(model)]
        assert all(layer.lora_a.shape[0] == 2 for _, layer in lora_layers(model))  # rank 2 on each
        return
    with pytest.raises(ConfigError, match=message):
        apply_lora(model, settings)


def test_settings_outside_what_lora_allows_are_refused_with_the_allowed_values() -> None:
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        LoRAConfig(r=0)
    with pytest.raises(
        ValidationError, match=r"expected some of qkv, attention_output, mlp_up, mlp_down, attn"
    ):
        LoRAConfig(targets=["attn.q_proj"])
    with pytest.raises(ValidationError, match="at least 1 item"):
        LoRAConfig(targets=[])


def test_targets_named_by_role_are_the_layers_of_that_role_in_either_recipe() -> None:
    by_role = LoRAConfig(r=2, targets=["qkv", "attention_output", "mlp_up", "mlp_down"])
    assert by_role == LoRAConfig(r=2, targets=["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"])
    modern = ModelConfig(
        n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=300, bias=False, position="rotary",
        norm="rmsnorm", mlp="swiglu",
    )  # fmt: skip
    for model in (base_model(), GPT(modern)):
        adapted = apply_lora(model, by_role)
        assert adapted == [
            f"transformer.h.{i}.{layer}" for i in range(model.config.n_layer) for layer in by_role.targets
        ]
