"""The run a compute budget buys under a fitted law: every depth of the size dial priced at the budget,
the one with the lowest predicted loss chosen, its prediction given with an interval, and a refusal
(one line) wherever the points cannot claim the answer."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gptcore.errors import ConfigError
from gptcore.model.size import ModelSize
from gptcore.scaling.points import ScalingPoint
from gptcore.scaling.study import Study

MAX_EXTRAPOLATION = 16.0  # a budget past this many times the grid's largest is beyond what it can claim
MIN_BUDGETS, MIN_SIZES, MIN_POINTS = 2, 3, 8


@dataclass(frozen=True)
class Candidate:
    """A depth of the dial a budget could buy: its size and, for a budget in seconds, the training
    FLOP/s measured at the nearest depth of the grid."""

    depth: int
    size: ModelSize
    flops_per_second: float | None = None


@dataclass(frozen=True)
class Budget:
    """A compute budget: FLOPs, or seconds of training on the device the grid was measured on."""

    flops: float | None = None
    seconds: float | None = None

    def flops_for(self, candidate: Candidate) -> float:
        if self.flops is not None:
            return self.flops
        assert self.seconds is not None and candidate.flops_per_second
        return self.seconds * candidate.flops_per_second

    def describe(self) -> str:
        return f"{self.flops:.3g} FLOPs" if self.flops is not None else f"{self.seconds:g} s of training"


@dataclass(frozen=True)
class Planned:
    """The chosen run, under the names its parameter file and its MLflow run use."""

    depth: int
    parameter_count: int
    non_embedding_parameter_count: int
    max_flops: float
    tokens: int
    steps: int
    tokens_per_parameter: float
    predicted_test_bits_per_byte: float
    predicted_low: float  # the interval: the bootstrap's 5th to 95th percentile, widened by the error
    predicted_high: float  # the fit made on the largest budget when it was left out
    data_constrained: bool = False  # a smaller size would do better but read the corpus more than once


def enough_points(points: Sequence[ScalingPoint]) -> None:
    """Refuses a grid too small for the law: fewer than `MIN_BUDGETS` budgets of `MIN_SIZES` sizes each,
    or fewer than `MIN_POINTS` points (the law has five coefficients)."""
    budgets = {p.max_flops for p in points}
    full = [c for c in budgets if len({p.depth for p in points if p.max_flops == c}) >= MIN_SIZES]
    if len(points) < MIN_POINTS or len(full) < MIN_BUDGETS:
        raise ConfigError(
            f"too few points to fit: {len(points)} finished runs over {len(budgets)} budgets, {len(full)} of "
            f"them with {MIN_SIZES} sizes; the law's five coefficients need at least {MIN_POINTS} runs over "
            f"{MIN_BUDGETS} budgets of {MIN_SIZES} sizes (add depths or budgets)"
        )


@dataclass(frozen=True)
class Limits:
    """What the corpus and the batch allow a planned run: one epoch's tokens (whole steps, as the trainer
    counts them), the tokens a step trains on, and whether a budget whose best size would read the corpus
    more than once is planned at the best size that reads it once (else refused)."""

    epoch_tokens: int
    tokens_per_step: int
    within_one_epoch: bool = False

    def steps(self, size: ModelSize, flops: float) -> int:
        """The steps `flops` buys at `size`, rounded up as the trainer rounds a budget."""
        return max(1, math.ceil(size.tokens_for(flops) / self.tokens_per_step))

    def fits(self, size: ModelSize, flops: float) -> bool:
        return self.steps(size, flops) * self.tokens_per_step <= self.epoch_tokens


def choose(found: Study, points: Sequence[ScalingPoint], budget: Budget, candidates: Sequence[Candidate],
           limits: Limits) -> Planned:  # fmt: skip
    """The candidate with the lowest predicted loss at `budget` under the study's chosen fit, or a
    one-line ConfigError saying why the points cannot claim one."""
    enough_points(points)
    largest = max(p.max_flops for p in points)
    if budget.flops is not None and budget.flops > MAX_EXTRAPOLATION * largest:
        raise ConfigError(
            f"budget {budget.describe()}: {budget.flops / largest:.0f}x the grid's largest budget "
            f"({largest:.3g}); the fit claims at most {MAX_EXTRAPOLATION:g}x: add a larger budget to the grid"
        )
    fit = found.chosen
    priced = [(c, budget.flops_for(c)) for c in candidates]
    within = [(c, flops) for c, flops in priced if limits.fits(c.size, flops)]
    if not within:
        raise ConfigError(
            f"budget {budget.describe()}: a budget beyond the corpus's tokens: even depth "
            f"{max(c.depth for c in candidates)} would read more than one epoch "
            f"({limits.epoch_tokens:,} tokens)"
        )

    def predicted(pair: tuple[Candidate, float]) -> float:
        candidate, flops = pair
        return fit.law.loss(
            fit.kind.of(candidate.size), limits.steps(candidate.size, flops) * limits.tokens_per_step
        )

    best = min(within, key=predicted)
    beyond = [pair for pair in priced if pair not in within and predicted(pair) < predicted(best)]
    if beyond and not limits.within_one_epoch:
        smaller = max(pair[0].depth for pair in beyond)
        raise ConfigError(
            f"budget {budget.describe()}: more than one epoch: its best size (depth {smaller} or smaller) "
            f"would read the {limits.epoch_tokens:,} training tokens more than once, which the law does not "
            "model; add text to the corpus, lower the budget, or plan within one epoch (--within-one-epoch)"
        )
    return _planned(found, best, limits, data_constrained=bool(beyond))


def _planned(found: Study, best: tuple[Candidate, float], limits: Limits, data_constrained: bool) -> Planned:
    (candidate, flops), fit = best, found.chosen
    size = candidate.size
    steps = limits.steps(size, flops)
    tokens, n = steps * limits.tokens_per_step, fit.kind.of(size)
    value = fit.law.loss(n, tokens)
    spread = [other.loss(n, tokens) for other in found.laws] or [value]
    low, high = np.percentile(spread, [5, 95]) if len(spread) > 1 else (value, value)
    error = fit.holdout_error
    return Planned(
        depth=candidate.depth,
        parameter_count=size.parameter_count,
        non_embedding_parameter_count=size.non_embedding_parameter_count,
        max_flops=float(flops),
        tokens=tokens,
        steps=steps,
        tokens_per_parameter=tokens / size.parameter_count,
        predicted_test_bits_per_byte=value,
        predicted_low=float(min(low, value * (1 - error))),
        predicted_high=float(max(high, value * (1 + error))),
        data_constrained=data_constrained,
    )
