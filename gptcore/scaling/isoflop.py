"""IsoFLOP curves (Chinchilla's approach 2): at each compute budget, the loss of every size trained on
that budget; a parabola in log N through them gives the budget's best size and its loss, and a power law
through those minima says how the best size grows with compute."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MIN_SIZES = 3  # a parabola needs three sizes at a budget


@dataclass(frozen=True)
class IsoFlopMinimum:
    """One budget's best size: where its parabola in log N bottoms out, and the loss there."""

    flops: float
    parameters: float
    loss: float
    inside: bool  # the minimum lies between the budget's smallest and largest sizes (else at an edge)


def minimum(flops: float, parameters: np.ndarray, losses: np.ndarray) -> IsoFlopMinimum | None:
    """The parabola's minimum through one budget's (N, L); None with fewer than `MIN_SIZES` sizes or a
    curve that does not bend upward (no minimum to claim)."""
    if len(set(parameters.tolist())) < MIN_SIZES:
        return None
    x = np.log(parameters)
    c2, c1, c0 = np.polyfit(x, losses, 2)
    if c2 <= 0:
        return None
    best = -c1 / (2 * c2)
    inside = bool(x.min() <= best <= x.max())
    return IsoFlopMinimum(flops, math.exp(best), float(c0 + c1 * best + c2 * best**2), inside)


def minima(flops: np.ndarray, parameters: np.ndarray, losses: np.ndarray) -> list[IsoFlopMinimum]:
    """Every budget's minimum, smallest budget first (budgets without one left out)."""
    found = (minimum(c, parameters[flops == c], losses[flops == c]) for c in sorted(set(flops.tolist())))
    return [m for m in found if m is not None]


def size_exponent(found: list[IsoFlopMinimum]) -> tuple[float, float] | None:
    """(k, a) of N_opt = k C^a through the minima inside their budgets' sizes; None with fewer than two."""
    inside = [m for m in found if m.inside]
    if len(inside) < 2:
        return None
    a, log_k = np.polyfit(np.log([m.flops for m in inside]), np.log([m.parameters for m in inside]), 1)
    return float(math.exp(log_k)), float(a)
