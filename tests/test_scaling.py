"""Scaling: the size dial's shapes and rates, budgets in FLOPs, the law recovered from points made by a
known one, the IsoFLOP minimum, and the planned run chosen or refused in one line."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gptcore.errors import ConfigError
from gptcore.model import dial
from gptcore.model.size import ModelSize
from gptcore.scaling import isoflop
from gptcore.scaling.law import Law, fit
from gptcore.scaling.plan import Budget, Candidate, Limits, choose
from gptcore.scaling.points import ParameterKind, ScalingPoint, arrays
from gptcore.scaling.study import Fit, Study
from gptcore.train.config import OptimizerConfig, TrainingConfig
from tasks.params.loading import load_params, load_profile

REPO = Path(__file__).resolve().parent.parent
ITERATION_1 = REPO / "params" / "iteration_1.yaml"
CHINCHILLA = Law(E=1.69, A=406.4, alpha=0.34, B=410.7, beta=0.28)


def test_the_dial_sets_width_heads_and_rates_from_depth_and_iteration_1_is_depth_4() -> None:
    for depth in (1, 2, 3, 6):
        config = dial.architecture(depth, "gpt2", 8192, 256)
        assert (config.n_layer, config.n_embd, config.n_head, config.head_dim()) == (
            depth,
            64 * depth,
            depth,
            64,
        )
    assert not dial.architecture(4, "gpt2", 8192, 256).differences(load_profile("gpt_first_cpu").architecture)
    modern = load_profile("gpt_first_cpu_modern").architecture
    assert not dial.architecture(4, "modern", 8192, 256).differences(modern)
    assert dial.learning_rate_scale(4) == 1.0 and dial.learning_rate_scale(1) == 2.0

    two = load_params(ITERATION_1, ["model.depth=2"])
    assert (two.model.name, two.model.architecture.n_embd, two.model.architecture.vocab_size) == (
        "gpt2-d2",
        128,
        8192,
    )
    optimizer = two.training_section("full").optimizer
    assert optimizer.learning_rate == pytest.approx(2e-3 * math.sqrt(2), rel=1e-3)  # 4 digits kept
    assert optimizer.min_learning_rate == pytest.approx(2e-4 * math.sqrt(2), rel=1e-3)
    assert two.training_section("smoke").optimizer == optimizer  # the smoke proves the same rates
    assert two.model.as_params()["model.depth"] == 2
    assert not load_params(ITERATION_1).model.at_depth(2).differences(two.model.architecture)
    muon = load_params(REPO / "params" / "iteration_1_modern.yaml", ["model.depth=1"])
    assert (
        muon.model.name == "modern-d1" and muon.training_section("full").optimizer.muon_learning_rate == 0.02
    )


def test_named_profiles_keep_their_shapes_and_their_keys() -> None:
    """A profile without a depth trains at the file's rates, and no new setting enters a key unset."""
    params = load_params(ITERATION_1)
    assert params.model.depth is None and params.training_section("full") == params.full
    assert (
        "max_flops" not in TrainingConfig().identity()
        and "tokens_per_parameter" not in TrainingConfig().identity()
    )
    assert "warmup_share" not in OptimizerConfig().identity()
    assert "warmup_share" in OptimizerConfig(warmup_share=0.05).identity()


def test_a_profile_stated_by_depth_alone_needs_its_vocabulary_and_context(tmp_path: Path) -> None:
    path = tmp_path / "d3.yaml"
    path.write_text(
        "depth: 3\narchitecture: {vocab_size: 8192}\ncpu: {batch_size: 8}\ngpu: {batch_size: 8}\n"
    )
    with pytest.raises(ConfigError, match=r"depth: the dial needs architecture.block_size"):
        load_profile(str(path))
    path.write_text(path.read_text().replace("{vocab_size: 8192}", "{vocab_size: 8192, block_size: 256}"))
    profile = load_profile(str(path))
    assert (profile.name, profile.architecture.n_layer, profile.architecture.n_embd) == ("gpt2-d3", 3, 192)


def test_model_size_counts_parameters_with_and_without_embeddings_and_flops_per_token() -> None:
    size = ModelSize.of(load_profile("gpt_first_cpu").architecture)
    assert size.parameter_count == 5_322_240  # the profile's stated count
    assert size.parameter_count - size.non_embedding_parameter_count == 8192 * 256 + 256 * 256  # wte, wpe
    assert size.flops_per_token == 6 * size.matmul_parameter_count + 12 * 4 * 256 * 256
    assert size.tokens_for(size.flops_per_token * 1000.5) == 1000


def grid_points(law: Law, noise: float = 0.0, seed: int = 0) -> list[ScalingPoint]:
    """Points of four sizes at three budgets as a law makes them (C = 6ND)."""
    draw = np.random.default_rng(seed)
    points = []
    for budget in (1e17, 3e17, 1e18):
        for depth, n in enumerate((2e7, 5e7, 1e8, 2e8), 1):
            tokens = int(budget / (6 * n))
            loss = law.loss(n, tokens) * (1 + noise * draw.standard_normal())
            points.append(ScalingPoint(depth, budget, int(n), int(n), tokens, budget, loss, 1))
    return points


def test_the_fit_recovers_the_law_that_made_the_points() -> None:
    points = grid_points(CHINCHILLA)
    kind = ParameterKind("total")
    law = fit(*arrays(points, kind))
    assert law.alpha == pytest.approx(CHINCHILLA.alpha, abs=0.03)
    assert law.beta == pytest.approx(CHINCHILLA.beta, abs=0.03)
    assert pytest.approx(CHINCHILLA.E, rel=0.05) == law.E
    far = (1e9, 2e10)  # 4x past the grid's largest budget's sizes and tokens
    assert law.loss(*far) == pytest.approx(CHINCHILLA.loss(*far), rel=0.005)
    assert all(
        law.loss(kind.of(p), p.tokens_seen) == pytest.approx(p.test_bits_per_byte, rel=1e-3) for p in points
    )
    assert law.optimal_tokens_per_parameter(1e21) == pytest.approx(
        CHINCHILLA.optimal_tokens_per_parameter(1e21), rel=0.25
    )


def test_an_isoflop_parabola_finds_the_budgets_best_size() -> None:
    n = np.array([1e6, 2e6, 4e6, 8e6, 16e6])
    losses = 3.0 + 0.1 * (np.log(n) - math.log(4e6)) ** 2
    found = isoflop.minimum(1e15, n, losses)
    assert found is not None and found.inside
    assert found.parameters == pytest.approx(4e6, rel=1e-6) and found.loss == pytest.approx(3.0)
    assert isoflop.minimum(1e15, n[:2], losses[:2]) is None  # two sizes draw no parabola
    assert isoflop.minimum(1e15, n, -losses) is None  # bending down: no minimum to claim


def candidates_for(sizes: list[int]) -> list[Candidate]:
    """Candidates whose FLOPs per token are 6N, as the synthetic points' are."""
    return [Candidate(depth, ModelSize(n, n, n, 6 * n)) for depth, n in enumerate(sizes, 1)]


def known(law: Law, points: list[ScalingPoint], laws: list[Law], error: float) -> Study:
    """A study whose chosen fit is `law` itself (its bootstrap `laws`, its held-out `error`)."""
    fitted = Fit(ParameterKind("total"), law, [0.0] * len(points), error, "the largest budget")
    return Study(points, {"total": fitted}, fitted, laws, [], None)


SIZES = [int(n) for n in np.geomspace(2e7, 1.6e9, 12)]


def test_the_plan_takes_the_size_with_the_lowest_predicted_loss_within_one_epoch() -> None:
    points = grid_points(CHINCHILLA)
    found = known(CHINCHILLA, points, [CHINCHILLA], 0.01)
    planned = choose(found, points, Budget(flops=4e18), candidates_for(SIZES), Limits(10**13, 1))
    losses = {n: CHINCHILLA.loss(n, math.ceil(4e18 / (6 * n))) for n in SIZES}
    assert planned.parameter_count == min(losses, key=losses.get)
    assert planned.predicted_test_bits_per_byte == pytest.approx(losses[planned.parameter_count], rel=1e-6)
    assert planned.predicted_low < planned.predicted_test_bits_per_byte < planned.predicted_high
    assert not planned.data_constrained


@pytest.mark.parametrize(
    ("budget", "epoch", "points", "message"),
    [
        (4e18, 10**13, 5, r"^too few points to fit: 5 finished runs over 2 budgets, 1 of them with 3 sizes"),
        (
            1e20,
            10**13,
            12,
            r"^budget 1e\+20 FLOPs: 100x the grid's largest budget \(1e\+18\); the fit claims",
        ),
        (4e18, 10**6, 12, r"^budget 4e\+18 FLOPs: a budget beyond the corpus's tokens: even depth 12"),
        (
            4e18,
            2 * 10**9,
            12,
            r"^budget 4e\+18 FLOPs: more than one epoch: its best size \(depth \d+ or smaller\)",
        ),
    ],
)
def test_the_plan_refuses_what_the_points_cannot_claim_in_one_line(
    budget: float, epoch: int, points: int, message: str
) -> None:
    grid = grid_points(CHINCHILLA)[:points]
    found = known(CHINCHILLA, grid, [], 0.0)
    with pytest.raises(ConfigError, match=message) as refused:
        choose(found, grid, Budget(flops=budget), candidates_for(SIZES), Limits(epoch, 1))
    assert "\n" not in str(refused.value)


def test_within_one_epoch_plans_the_best_size_that_reads_the_corpus_once() -> None:
    points = grid_points(CHINCHILLA)
    found = known(CHINCHILLA, points, [CHINCHILLA], 0.0)
    limits = Limits(2 * 10**9, 1, within_one_epoch=True)
    planned = choose(found, points, Budget(flops=4e18), candidates_for(SIZES), limits)
    assert planned.data_constrained and planned.tokens <= 2 * 10**9
    fitting = [n for n in SIZES if math.ceil(4e18 / (6 * n)) <= 2 * 10**9]
    assert planned.parameter_count == min(fitting)  # the smallest that fits: the law wants smaller still


def test_the_grid_names_its_points_and_the_plan_never_prices_a_depth_below_the_grids_smallest() -> None:
    from tasks.params.scale import candidates, grid_trials
    from tasks.params.schema import ScaleConfig

    trials = grid_trials(ScaleConfig(depths=[3, 2], budgets=[5e12, 2.5e12, 1e13]))
    assert [t.name for t in trials][:3] == ["d2-2.5e+12", "d3-2.5e+12", "d2-5e+12"]
    params = load_params(ITERATION_1)
    point = ScalingPoint(2, 2.5e12, 1, 1, 2048, 2.5e12, 2.5, 2048, 1e4)
    found = candidates(params, [point, replace(point, depth=3)], 5)
    assert [c.depth for c in found] == [2, 3, 4, 5]
    assert found[0].size == ModelSize.of(load_params(ITERATION_1, ["model.depth=2"]).model.architecture)


def test_a_point_is_the_same_run_in_any_grid_so_a_larger_grid_trains_only_its_new_points() -> None:
    """A point's `gptpipe run` (the study's shared overrides and the point's own) depends on its depth and
    budget alone: in a grid with a budget more, the points both grids hold are the same runs, whose
    stages the cache then serves (tests/test_pipeline.py pins that a repeated run trains nothing)."""
    from tasks.params.scale import grid_trials, shared_overrides
    from tasks.params.schema import PipelineParams, ScaleConfig

    params = load_params(ITERATION_1)

    def runs(budgets: list[float]) -> dict[str, PipelineParams]:
        settings = ScaleConfig(depths=[2, 3], budgets=budgets)
        shared = shared_overrides(params, settings)
        return {t.name: load_params(ITERATION_1, [*shared, *t.overrides()]) for t in grid_trials(settings)}

    smaller, larger = runs([2.5e12, 5e12]), runs([2.5e12, 5e12, 1e13])
    assert set(larger) - set(smaller) == {"d2-1e+13", "d3-1e+13"}
    assert all(larger[name] == point for name, point in smaller.items())
    assert larger["d2-1e+13"].full.max_flops == 1e13 and larger["d2-1e+13"].model.depth == 2


SCALE_CEILING = 900  # against a hang only


@pytest.mark.integration
@pytest.mark.slow(seconds=110)
@pytest.mark.timeout(SCALE_CEILING + 60)
def test_a_study_fits_the_grid_records_the_law_and_writes_the_planned_run(
    tmp_path: Path, prefect_env: dict[str, str]
) -> None:
    import json
    import subprocess

    from mlflow import MlflowClient
    from test_pipeline import GPTPIPE, write_corpus, write_params

    write_corpus(tmp_path, documents=120, seed=5)
    params = write_params(tmp_path, full_steps=4)
    with params.open("a") as file:  # one count of parameters, few refits: the fit's cost is not the test
        file.write("scale: {parameters: total, bootstrap: 10}\n")
    planned = tmp_path / "planned.yaml"

    command = [*GPTPIPE, "scale", "--params", str(params), "--depths", "1,2,3", "--budgets", "2e9,4e9,8e9",
               "--target-flops", "1.6e10", "--write", str(planned), "--parallel", "2"]  # fmt: skip
    done = subprocess.run(
        command, env=prefect_env, cwd=REPO, capture_output=True, text=True, timeout=SCALE_CEILING
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "law (N = " in done.stderr and "planned: depth " in done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    client = MlflowClient(prefect_env["MLFLOW_TRACKING_URI"])
    run = client.get_run(result["scale_run_id"])
    assert {
        "law.E",
        "law.alpha",
        "law.beta",
        "predicted_test_bits_per_byte",
        "optimal_tokens_per_parameter",
    } <= set(run.data.metrics)
    artifacts = {
        a.path for folder in ("plots", "planned") for a in client.list_artifacts(run.info.run_id, folder)
    }
    assert artifacts == {"plots/loss_against_flops.png", "plots/isoflop_curves.png", "planned/planned.yaml"}
    points = json.loads(
        Path(client.download_artifacts(run.info.run_id, "scaling_points.json", str(tmp_path))).read_text()
    )
    assert len(points["data"]) == 9

    written = load_params(planned)
    assert written.model.depth == result["planned"]["depth"] and written.full.max_flops == 1.6e10
    assert written.full.max_steps is None and written.full.optimizer.warmup_share == 0.05
    assert written.prediction.low <= written.prediction.test_bits_per_byte <= written.prediction.high
