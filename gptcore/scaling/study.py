"""A scaling study of measured points: the law fitted on each count of parameters, each judged by how
well it predicts the grid's largest budget from the smaller ones (the extrapolation it is asked to make,
made where the answer is known), the better one kept with a bootstrap of its predictions, and the
IsoFLOP minima beside it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gptcore.scaling import isoflop
from gptcore.scaling.isoflop import IsoFlopMinimum
from gptcore.scaling.law import Law, bootstrap, fit
from gptcore.scaling.points import ParameterKind, ParameterKindName, ScalingPoint, arrays

KINDS: tuple[ParameterKindName, ...] = ("total", "non_embedding")


@dataclass(frozen=True)
class Fit:
    """The law on one count of parameters, and how well it extrapolates."""

    kind: ParameterKind
    law: Law
    residuals: list[float]  # each point's measured / fitted - 1
    holdout_error: float  # the largest |predicted / measured - 1| on points the fit did not see
    holdout: str  # which points those were: the largest budget's, or each point in turn

    def predict(self, point: ScalingPoint) -> float:
        return self.law.loss(self.kind.of(point), point.tokens_seen)


@dataclass(frozen=True)
class Study:
    points: list[ScalingPoint]
    fits: dict[str, Fit]
    chosen: Fit  # the count of parameters whose fit extrapolates better
    laws: list[Law]  # the chosen fit's bootstrap
    minima: list[IsoFlopMinimum]  # per budget, on the chosen count
    exponent: tuple[float, float] | None  # (k, a): N_opt = k C^a through the minima


def holdout_error(points: Sequence[ScalingPoint], kind: ParameterKind) -> tuple[float, str]:
    """The largest relative error on points a fit did not see: the largest budget's, predicted from
    the others when at least two budgets remain, else each point from all the others."""
    budgets = sorted({p.max_flops for p in points})
    if len(budgets) >= 3:
        seen = [p for p in points if p.max_flops < budgets[-1]]
        law = fit(*arrays(seen, kind))
        unseen = [p for p in points if p.max_flops == budgets[-1]]
        errors = [law.loss(kind.of(p), p.tokens_seen) / p.test_bits_per_byte - 1 for p in unseen]
        return max(abs(e) for e in errors), f"the {budgets[-1]:.3g}-FLOP budget from the smaller ones"
    errors = []
    for index, point in enumerate(points):
        law = fit(*arrays([p for i, p in enumerate(points) if i != index], kind))
        errors.append(law.loss(kind.of(point), point.tokens_seen) / point.test_bits_per_byte - 1)
    return max(abs(e) for e in errors), "each point from all the others"


def fitted(points: Sequence[ScalingPoint], kind: ParameterKind) -> Fit:
    law = fit(*arrays(list(points), kind))
    residuals = [p.test_bits_per_byte / law.loss(kind.of(p), p.tokens_seen) - 1 for p in points]
    error, holdout = holdout_error(points, kind)
    return Fit(kind, law, residuals, error, holdout)


def study(
    points: Sequence[ScalingPoint], kinds: Sequence[ParameterKindName] = KINDS, samples: int = 100
) -> Study:
    """The fits on each of `kinds`, the one that extrapolates better kept with `samples` bootstrap laws."""
    fits = {name: fitted(points, ParameterKind(name)) for name in kinds}
    chosen = min(fits.values(), key=lambda f: f.holdout_error)
    laws = bootstrap(*arrays(list(points), chosen.kind), chosen.law, samples)
    flops = np.array([p.max_flops for p in points])
    n, _, losses = arrays(list(points), chosen.kind)
    found = isoflop.minima(flops, n, losses)
    return Study(list(points), fits, chosen, laws, found, isoflop.size_exponent(found))
