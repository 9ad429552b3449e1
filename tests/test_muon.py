"""`optimizer.name: muon`: torch's Muon for the blocks' matrices, AdamW for embeddings, head, norms and
biases, on one schedule; through the trainer it learns, resumes bit for bit, and leaves an AdamW run's
identity (cache keys, a resume's check) as it was before the choice existed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT
from gptcore.train.config import OptimizerConfig, TrainingConfig
from gptcore.train.muon import MuonWithAdamW
from gptcore.train.trainer import train
from tests.test_trainer import Recorder, job

MODERN = ModelConfig(
    n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=300, position="rotary", norm="rmsnorm",
    qk_norm=True, mlp="swiglu", tie_embeddings=False, bias=False,
)  # fmt: skip
MUON = OptimizerConfig(name="muon", learning_rate=3e-3, warmup_steps=2, muon_learning_rate=0.02)


class Runtime:
    fused_adamw = False


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
    assert adamw.identity() == {key: value for key, value in adamw.model_dump().items()
                                if key not in ("name", "muon_learning_rate", "muon_momentum")}  # fmt: skip
    assert MUON.identity()["name"] == "muon" and MUON.identity()["muon_learning_rate"] == 0.02
