"""`optimizer.name: muon`: torch's Muon for the blocks' matrices, AdamW for embeddings, head, norms and
biases, on one schedule; through the trainer it learns, resumes bit for bit, and leaves an AdamW run's
identity (cache keys, a resume's check) as it was before the choice existed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT
from gptcore.train import muon
from gptcore.train.config import OptimizerConfig, TrainingConfig
from gptcore.train.muon import Muon, MuonWithAdamW, orthogonal_dtype
from gptcore.train.trainer import train
from tests.test_trainer import Recorder, job

MODERN = ModelConfig(
    n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=300, position="rotary", norm="rmsnorm",
    qk_norm=True, mlp="swiglu", tie_embeddings=False, bias=False,
)  # fmt: skip
MUON = OptimizerConfig(name="muon", learning_rate=3e-3, warmup_steps=2, muon_learning_rate=0.02)


class Runtime:
    fused_adamw = False
    device = "cpu"


def test_muon_trains_the_blocks_matrices_and_adamw_everything_else_once_each() -> None:
    from gptcore.train.setup import make_optimizer

    model = GPT(MODERN)
    optimizer = make_optimizer(model, TrainingConfig(optimizer=MUON), Runtime())
    assert isinstance(optimizer, MuonWithAdamW)
    names = {id(p): name for name, p in model.named_parameters()}
    by_muon = {names[id(p)] for group in optimizer.muon.param_groups for p in group["params"]}
    by_adamw = {names[id(p)] for group in optimizer.adamw.param_groups for p in group["params"]}
    assert by_muon and not by_muon & by_adamw and by_muon | by_adamw == set(names.values())
    assert all(name.startswith("transformer.h.") and name.endswith(".weight") for name in by_muon)
    assert {
        "transformer.wte.weight",
        "lm_head.weight",
    } <= by_adamw and "transformer.h.0.ln_1.weight" in by_adamw
    assert not any("norm" in name for name in by_muon)  # QK-norm's weights are 1-D: AdamW's


def test_one_schedule_sets_each_groups_rate_at_its_own_peak() -> None:
    from gptcore.train.schedule import WarmupCosine
    from gptcore.train.setup import make_optimizer

    optimizer = make_optimizer(GPT(MODERN), TrainingConfig(optimizer=MUON), Runtime())
    WarmupCosine(peak=3e-3, minimum=3e-4, warmup_steps=0, total_steps=10).apply(optimizer, 0)
    assert [group["lr"] for group in optimizer.muon.param_groups] == [pytest.approx(0.02)]
    assert [group["lr"] for group in optimizer.adamw.param_groups] == [pytest.approx(3e-3)] * 2


def muon_job(directory: Path, **changes: object) -> object:
    from dataclasses import replace

    training = {"max_steps": 8, "checkpoint_every": 4, "eval_every": 4, "optimizer": MUON}
    return replace(job(directory, training=training, **changes), model=MODERN)


def test_a_muon_run_learns_and_a_killed_one_resumes_bit_for_bit(tmp_path: Path) -> None:
    whole, broken, resumed = Recorder(), Recorder(stop_at=6), Recorder()
    train(muon_job(tmp_path / "whole"), whole)
    losses = whole.losses()
    assert losses[-1][1] < losses[0][1]  # (step, loss)
    with pytest.raises(KeyboardInterrupt):
        train(muon_job(tmp_path / "broken"), broken)
    train(muon_job(tmp_path / "broken", resume=True), resumed)
    assert resumed.of("start")[0]["start_step"] == 4
    assert resumed.losses() == losses[4:], "weights, both optimizers' state, RNG and data position restored"
    from gptcore.checkpoint.files import load_checkpoint

    assert set(load_checkpoint(tmp_path / "whole" / "final.pt")["optimizer"]) == {"muon", "adamw"}


def test_an_adamw_runs_identity_is_what_it_was_before_muon_could_be_chosen() -> None:
    adamw = OptimizerConfig()
    assert "name" not in adamw.identity() and "muon_learning_rate" not in adamw.identity()
    unset = ("name", "muon_learning_rate", "muon_momentum", "warmup_share")  # Muon's, and a warmup share
    assert adamw.identity() == {key: value for key, value in adamw.model_dump().items() if key not in unset}
    assert MUON.identity()["name"] == "muon" and MUON.identity()["muon_learning_rate"] == 0.02


def _stepped(optimizer_type: type, steps: int = 3, **options) -> list[torch.Tensor]:
    """A wide, a tall and a square matrix after `steps` of the optimizer on fixed gradients."""
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(shape, generator=generator) for shape in ((8, 24), (24, 8), (16, 16))]
    weights = [torch.nn.Parameter(weight) for weight in weights]
    optimizer = optimizer_type(weights, lr=0.02, weight_decay=0.1, **options)
    for _ in range(steps):
        for weight in weights:
            weight.grad = torch.randn(weight.shape, generator=generator)
        optimizer.step()
    return [weight.detach() for weight in weights]


def test_muon_in_bf16_is_torchs_step_to_the_bit_and_in_fp32_within_bf16s_rounding() -> None:
    torchs = _stepped(torch.optim.Muon)
    assert all(torch.equal(a, b) for a, b in zip(_stepped(Muon, dtype=torch.bfloat16), torchs, strict=True))
    in_fp32 = _stepped(Muon, dtype=torch.float32)
    starts = _stepped(Muon, steps=0)
    for fp32, bf16, start in zip(in_fp32, torchs, starts, strict=True):
        moved = (bf16 - start).abs().max()
        assert not torch.equal(fp32, bf16) and (fp32 - bf16).abs().max() < 0.05 * moved


def test_the_orthogonalisation_is_semi_orthogonal_on_the_short_side() -> None:
    update = torch.randn(64, 16)
    for dtype in (torch.float32, torch.bfloat16):
        singular = torch.linalg.svdvals(
            muon.orthogonalise(update, (3.4445, -4.775, 2.0315), 5, 1e-7, dtype).float()
        )
        assert singular.shape == (16,) and singular.min() > 0.5 and singular.max() < 1.3  # Muon's band


def test_bf16_iterations_only_where_the_hardware_multiplies_bf16(monkeypatch) -> None:
    assert orthogonal_dtype("cuda") == torch.bfloat16
    monkeypatch.setattr(muon, "cpu_native", lambda precision: True)
    assert orthogonal_dtype("cpu") == torch.bfloat16
    for flags in (False, None):  # an AVX2-only CPU, or one whose flags are unknown
        monkeypatch.setattr(muon, "cpu_native", lambda precision, flags=flags: flags)
        assert orthogonal_dtype("cpu") == torch.float32
    assert orthogonal_dtype("mps") == torch.float32


def test_the_memory_estimate_counts_the_state_each_optimizer_keeps() -> None:
    """AdamW keeps two fp32 moments per parameter, Muon one momentum per matrix entry: the estimate's
    optimizer term is what the optimizer holds after a step."""
    from gptcore.train.setup import make_optimizer, optimizer_state_bytes

    model = GPT(MODERN)
    for config in (TrainingConfig(), TrainingConfig(optimizer=MUON)):
        optimizer = make_optimizer(model, config, Runtime())
        for parameter in model.parameters():
            parameter.grad = torch.ones_like(parameter)
        optimizer.step()
        held = sum(
            state.nbytes
            for per_parameter in optimizer.state.values()
            for state in per_parameter.values()
            if state.dim()  # not AdamW's step counters
        )
        assert optimizer_state_bytes(model, config) == held
    assert optimizer_state_bytes(model, TrainingConfig()) == 8 * model.parameter_count()
