"""The modern recipe beside GPT-2's: the default config is GPT-2 to the parameter name and count; every
option alone and all together trains, samples through both caches as the full forward computes, and
recomputes under activation checkpointing to the same loss and gradients."""

from __future__ import annotations

import pytest
import torch

from gptcore.finetune.config import LoRAConfig
from gptcore.finetune.lora import apply_lora
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT
from gptcore.model.kv_cache import KVCache
from gptcore.model.slot_cache import SlotCache

SHAPE = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 300}
MODERN = {"position": "rotary", "norm": "rmsnorm", "qk_norm": True, "tie_embeddings": False}
OPTIONS = {
    "rotary": {"position": "rotary"},
    "rmsnorm": {"norm": "rmsnorm"},
    "qk_norm": {"qk_norm": True},
    "relu2": {"mlp": "relu2"},
    "swiglu": {"mlp": "swiglu"},
    "untied": {"tie_embeddings": False},
    "modern-swiglu": {**MODERN, "mlp": "swiglu"},
    "modern-relu2": {**MODERN, "mlp": "relu2"},
}
MODERNS = ["modern-swiglu", "modern-relu2"]
GPT2_KEYS = [
    "transformer.wte.weight",
    "transformer.wpe.weight",
    "transformer.h.0.ln_1.weight",
    "transformer.h.0.ln_1.bias",
    "transformer.h.0.attn.c_attn.weight",
    "transformer.h.0.attn.c_attn.bias",
    "transformer.h.0.attn.c_proj.weight",
    "transformer.h.0.attn.c_proj.bias",
    "transformer.h.0.ln_2.weight",
    "transformer.h.0.ln_2.bias",
    "transformer.h.0.mlp.c_fc.weight",
    "transformer.h.0.mlp.c_fc.bias",
    "transformer.h.0.mlp.c_proj.weight",
    "transformer.h.0.mlp.c_proj.bias",
    "transformer.ln_f.weight",
    "transformer.ln_f.bias",
    "lm_head.weight",
]


def config(option: str | None = None, **changes: object) -> ModelConfig:
    return ModelConfig(**{**SHAPE, **(OPTIONS[option] if option else {}), **changes})


def model_of(option: str | None = None, **changes: object) -> GPT:
    torch.manual_seed(0)
    return GPT(config(option, **changes))


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(
        0, SHAPE["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed)
    )


def test_the_default_config_is_gpt2_to_the_name_and_the_count() -> None:
    model = model_of(n_layer=1)
    assert list(model.state_dict()) == GPT2_KEYS
    v, t, c = SHAPE["vocab_size"], SHAPE["block_size"], SHAPE["n_embd"]
    block = 2 * c + (3 * c * c + 3 * c) + (c * c + c) + 2 * c + (4 * c * c + 4 * c) + (4 * c * c + c)
    assert model.parameter_count() == v * c + t * c + block + 2 * c
    assert model.matmul_parameter_count() == v * c + 12 * c * c
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.rotary is None


@pytest.mark.parametrize("option", list(OPTIONS))
def test_each_option_and_all_together_build_run_and_learn_a_fixed_batch(option: str) -> None:
    model = model_of(option).train()
    batch = tokens(4, 16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(6):
        logits, loss = model(batch[:, :-1], batch[:, 1:])
        assert logits.shape == (4, 15, SHAPE["vocab_size"]) and torch.isfinite(loss)
        optimizer.zero_grad()
        loss.backward()
        assert all(p.grad is not None for p in model.parameters())
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1


def test_the_options_build_the_layers_they_name() -> None:
    rotary = model_of("rotary")
    assert "transformer.wpe.weight" not in rotary.state_dict()
    assert not any("cos" in name or "sin" in name for name in rotary.state_dict())  # derived, not saved
    assert rotary.parameter_count() == model_of().parameter_count() - SHAPE["block_size"] * SHAPE["n_embd"]
    rms = model_of("modern-swiglu")
    assert isinstance(rms.transformer.ln_f, torch.nn.RMSNorm)
    assert rms.transformer.h[0].attn.q_norm.weight.shape == (16,)  # one weight per head dimension
    assert "transformer.h.0.ln_1.bias" not in rms.state_dict()
    swiglu = config("swiglu")
    assert swiglu.mlp_width() == 128 and config().mlp_width() == 128  # 2/3 of 4 * 32, up to 64; 4 * 32
    assert ModelConfig(**{**SHAPE, "n_embd": 768, "n_head": 12, "mlp": "swiglu"}).mlp_width() == 2048
    assert model_of("swiglu").transformer.h[0].mlp.c_fc.weight.shape == (256, 32)  # gate and up, fused


def test_an_untied_head_has_its_own_weight_and_counts_as_a_matmul() -> None:
    tied, untied = model_of(), model_of("untied")
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    assert untied.lm_head.weight.std().item() == pytest.approx(0.02, rel=0.1)
    vc = SHAPE["vocab_size"] * SHAPE["n_embd"]
    assert untied.parameter_count() == tied.parameter_count() + vc
    # The embedding becomes a lookup, the head the matmul: the per-token matmul weights are the same.
    assert untied.matmul_parameter_count() == tied.matmul_parameter_count()
    assert "lm_head.weight" in untied.state_dict() and "transformer.wte.weight" in untied.state_dict()


@pytest.mark.parametrize("option", MODERNS)
@pytest.mark.parametrize(
    "pieces", [[(0, 8), (8, 16)], [(i, i + 1) for i in range(16)]], ids=["2-chunks", "1-by-1"]
)
def test_kv_cache_logits_equal_the_full_forward(option: str, pieces: list[tuple[int, int]]) -> None:
    model = model_of(option).eval()
    ids = tokens(2, 16)
    with torch.no_grad():
        whole = model(ids, targets=ids)[0]
        cache = KVCache(model.config.n_layer, model.config.block_size)
        for start, end in pieces:
            logits = model(ids[:, start:end], cache=cache)[0]
            torch.testing.assert_close(logits[:, -1], whole[:, end - 1], rtol=1e-5, atol=1e-5)
    assert cache.full


@pytest.mark.parametrize("option", MODERNS)
def test_slot_cache_decodes_each_row_at_its_own_position_as_the_full_forward(option: str) -> None:
    model = model_of(option).eval()
    sequences = [tokens(1, 16, seed=2)[0], tokens(1, 16, seed=3)[0]]
    prompts = [4, 9]  # the rows sit at different offsets, so each decode step rotates by its own position
    cache = SlotCache(model.config.n_layer, model.config.block_size, slots=3)
    with torch.no_grad():
        wholes = [model(s[None], targets=s[None])[0][0] for s in sequences]
        for row, (sequence, length) in enumerate(zip(sequences, prompts, strict=True)):
            logits = model(sequence[None, :length], cache=cache.prefill(row))[0]
            torch.testing.assert_close(logits[0, -1], wholes[row][length - 1], rtol=1e-5, atol=1e-5)
        lengths = list(prompts)
        while max(lengths) < 16:
            step = torch.stack([s[n : n + 1] for s, n in zip(sequences, lengths, strict=True)])
            logits = model(step, cache=cache.decode(2, max(lengths)))[0]
            for row, n in enumerate(lengths):
                torch.testing.assert_close(logits[row, -1], wholes[row][n], rtol=1e-5, atol=1e-5)
            lengths = [n + 1 for n in lengths]
    assert cache.lengths[:2].tolist() == lengths


@pytest.mark.parametrize("option", MODERNS)
def test_activation_checkpointing_gives_the_same_loss_and_gradients(option: str) -> None:
    batch = tokens(2, 16)
    results = []
    for recompute in (False, True):
        model = model_of(option).train()
        model.activation_checkpointing = recompute
        _, loss = model(batch, batch)
        loss.backward()
        results.append((loss.detach(), {name: p.grad for name, p in model.named_parameters()}))
    (plain_loss, plain), (loss, grads) = results
    torch.testing.assert_close(loss, plain_loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == plain.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain[name], rtol=1e-5, atol=1e-6, msg=name)


def test_rotary_refuses_an_odd_head_dimension_in_one_sentence() -> None:
    with pytest.raises(
        ValueError, match=r"position 'rotary' needs an even head dimension: n_embd 30 / n_head 2 = 15"
    ):
        ModelConfig(**{**SHAPE, "n_embd": 30, "position": "rotary"})
    ModelConfig(**{**SHAPE, "n_embd": 30})  # learned positions take any head dimension


def test_rotary_tables_stay_fp32_when_the_model_is_cast() -> None:
    model = model_of("rotary")
    reference = model.rotary.cos.clone()
    model.to(torch.bfloat16)
    assert model.rotary.cos.dtype == torch.float32 and torch.equal(model.rotary.cos, reference)
    assert model.transformer.wte.weight.dtype == torch.bfloat16
    with torch.no_grad():
        logits, _ = model(tokens(1, 8))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()


def test_rotary_attention_depends_on_the_positions_difference_alone() -> None:
    from gptcore.model.rotary import Rotary, rotate

    rotary = Rotary(head_dim=8, block_size=32, theta=10000.0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(i: int, j: int) -> torch.Tensor:
        at_i, at_j = rotary(torch.tensor([i])), rotary(torch.tensor([j]))
        return (rotate(q, *at_i) * rotate(k, *at_j)).sum()

    torch.testing.assert_close(score(7, 3), score(20, 16))
    torch.testing.assert_close(score(0, 0), (q * k).sum())


@pytest.mark.parametrize("option", ["swiglu", "modern-relu2"])
def test_lora_targets_find_every_mlp_variants_layers(option: str) -> None:
    model = model_of(option)
    targets = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
    adapted = apply_lora(model, LoRAConfig(r=4, targets=targets))
    assert len(adapted) == 4 * SHAPE["n_layer"]
    _, loss = model(tokens(2, 8), tokens(2, 8, seed=4))
    loss.backward()


# --- what reads and writes a model: its files, its identity, the Hugging Face export ------------------


def test_a_gpt2_configs_identity_is_what_it_was_before_the_recipe_existed() -> None:
    """Cache keys and a resume's check read `identity()`: a GPT-2 model's keeps its pre-recipe keys, so
    its cached stages and checkpoints stay valid; a modern one names what differs."""
    assert ModelConfig(**SHAPE).identity() == {**SHAPE, "dropout": 0.0, "bias": True}
    modern = ModelConfig(**SHAPE, **MODERN, mlp="swiglu")
    assert modern.recipe() == {**MODERN, "mlp": "swiglu"}
    assert modern.identity() == {**SHAPE, "dropout": 0.0, "bias": True, **MODERN, "mlp": "swiglu"}


@pytest.mark.parametrize("name", MODERNS)
def test_a_modern_model_reads_back_from_its_checkpoint_as_model_files(name: str, tmp_path) -> None:
    from gptcore.checkpoint import files as ckpt
    from gptcore.checkpoint.load import checkpoint_model_files
    from gptcore.checkpoint.record import CheckpointRecord
    from gptcore.export.model_files import read_model_files

    torch.manual_seed(0)
    model = GPT(ModelConfig(**SHAPE, **OPTIONS[name])).eval()
    from tokenizers import Tokenizer, models

    Tokenizer(models.BPE()).save(str(tmp_path / "tokenizer.json"))  # the record names one; never read here
    tokenizer = {"tokenizer": str(tmp_path / "tokenizer.json")}
    record = CheckpointRecord("final", 1, config={}, model_config=model.config, metadata=tokenizer)
    path, _ = ckpt.save_checkpoint(tmp_path / "run", "final", {"model": model.state_dict()}, record)
    files, _ = checkpoint_model_files(path, tmp_path / "files")
    back = read_model_files(files.weights, files.config)
    ids = torch.randint(0, SHAPE["vocab_size"], (2, 12))
    with torch.no_grad():
        assert torch.equal(back(ids, targets=ids)[0], model(ids, targets=ids)[0])
    assert back.lm_head.weight is not back.transformer.wte.weight  # untied stays untied


def test_the_hugging_face_export_refuses_a_recipe_gpt2_cannot_hold(tmp_path) -> None:
    from gptcore.errors import ConfigError
    from gptcore.export.hf import export_hf

    model = GPT(ModelConfig(**SHAPE, position="rotary"))
    with pytest.raises(
        ConfigError,
        match=r"^export: position 'rotary' with norm 'layernorm', mlp 'gelu': the Hugging Face export "
        r"holds GPT-2's layout or Llama's \(rotary, rmsnorm, swiglu; Qwen3's with qk_norm\)$",
    ):
        export_hf(model, tmp_path / "tokenizer.json", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
