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
from gptcore.scaling.law import Law
from gptcore.scaling.points import ParameterKind, ScalingPoint

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


def choose(
    law: Law,
    laws: Sequence[Law],
    kind: ParameterKind,
    points: Sequence[ScalingPoint],
    budget: Budget,
    candidates: Sequence[Candidate],
    tokens_per_step: int,
    train_tokens: int,
    holdout_error: float,
) -> Planned:
    """The candidate with the lowest predicted loss at `budget`, or a one-line ConfigError saying why
    the points cannot claim one."""
    enough_points(points)
    largest = max(p.max_flops for p in points)
    if budget.flops is not None and budget.flops > MAX_EXTRAPOLATION * largest:
        raise ConfigError(
            f"budget {budget.describe()}: {budget.flops / largest:.0f}x the grid's largest budget "
            f"({largest:.3g}); the fit claims at most {MAX_EXTRAPOLATION:g}x: add a larger budget to the grid"
        )
    priced = [(c, budget.flops_for(c)) for c in candidates]
    within = [(c, flops) for c, flops in priced if c.size.tokens_for(flops) <= train_tokens]
    if not within:
        raise ConfigError(
            f"budget {budget.describe()}: a budget beyond the corpus's tokens: even depth "
            f"{max(c.depth for c in candidates)} would read more than the {train_tokens:,} training tokens"
        )

    def predicted(pair: tuple[Candidate, float]) -> float:
        candidate, flops = pair
        return law.loss(kind.of(candidate.size), candidate.size.tokens_for(flops))

    best = min(within, key=predicted)
    shallower = [pair for pair in priced if pair[0].depth < best[0].depth and pair not in within]
    if shallower and predicted(max(shallower, key=lambda pair: pair[0].depth)) < predicted(best):
        smaller = max(shallower, key=lambda pair: pair[0].depth)[0]
        raise ConfigError(
            f"budget {budget.describe()}: more than one epoch: its best size (depth {smaller.depth} or "
            f"smaller) would read the {train_tokens:,} training tokens more than once, which the law does "
            "not model; add text to the corpus or lower the budget"
        )
    return _planned(law, laws, kind, best, tokens_per_step, holdout_error)


def _planned(
    law: Law,
    laws: Sequence[Law],
    kind: ParameterKind,
    best: tuple[Candidate, float],
    per_step: int,
    error: float,
) -> Planned:
    candidate, flops = best
    size = candidate.size
    steps = max(1, math.ceil(size.tokens_for(flops) / per_step))  # as the trainer rounds a budget: up
    tokens, n = steps * per_step, kind.of(size)
    value = law.loss(n, tokens)
    spread = [other.loss(n, tokens) for other in laws] or [value]
    low, high = np.percentile(spread, [5, 95]) if len(spread) > 1 else (value, value)
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
    )
