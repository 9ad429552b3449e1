"""How the loss falls with parameters and tokens: Chinchilla's parametric law L(N, D) = E + A/N^α + B/D^β
(Hoffmann et al. 2022, approach 3), fitted to measured runs, with a bootstrap for its uncertainty.

The fit is theirs: the Huber loss (δ = 1e-3) of log L_predicted − log L_measured, L-BFGS from a grid of
starting points, the best kept; the law is written as exp(LSE(a − α log N, b − β log D, e)) so A, B
and E stay positive. Fitted on a handful of points (a grid of sizes by budgets), its coefficients are
loose one by one, but its predictions near the points are not: the bootstrap refits resampled points and
reports the spread of a prediction, not of a coefficient."""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import minimize

HUBER_DELTA = 1e-3
# Starting points: Chinchilla's grid, narrowed to what small models take (their α and β near 0.3).
STARTS = list(
    itertools.product((0.0, 5.0, 15.0), (0.0, 5.0, 15.0), (-1.0, 0.5), (0.2, 0.5), (0.2, 0.5))
)  # fmt: skip
BOUNDS = [(-10.0, 60.0), (-10.0, 60.0), (-5.0, 3.0), (0.01, 3.0), (0.01, 3.0)]  # a, b, e, α, β


@dataclass(frozen=True)
class Law:
    """L(N, D) = E + A/N^α + B/D^β: N parameters, D training tokens, L in the measured unit."""

    E: float
    A: float
    alpha: float
    B: float
    beta: float

    def loss(self, parameters: float, tokens: float) -> float:
        return self.E + self.A / parameters**self.alpha + self.B / tokens**self.beta

    def optimal_tokens_per_parameter(self, flops: float) -> float:
        """D/N at the compute-optimal split of `flops` under C = 6ND (Chinchilla's eq. 4):
        N_opt = G (C/6)^(β/(α+β)), D_opt = (C/6) / N_opt, G = (αA / (βB))^(1/(α+β))."""
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1 / (self.alpha + self.beta))
        n = g * (flops / 6) ** (self.beta / (self.alpha + self.beta))
        return (flops / 6) / n / n

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _objective(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_loss: np.ndarray) -> float:
    a, b, e, alpha, beta = theta
    predicted = np.logaddexp(np.logaddexp(a - alpha * log_n, b - beta * log_d), e)
    residual = np.abs(predicted - log_loss)
    huber = np.where(residual <= HUBER_DELTA, 0.5 * residual**2, HUBER_DELTA * (residual - 0.5 * HUBER_DELTA))
    return float(huber.sum())


def fit(
    parameters: np.ndarray, tokens: np.ndarray, losses: np.ndarray, starts: list[tuple] | None = None
) -> Law:
    """The law that fits (N, D, L) best from any of `starts` (a, b, e, α, β; default: the grid)."""
    data = (np.log(parameters), np.log(tokens), np.log(losses))
    best: tuple[float, np.ndarray] | None = None
    for start in starts or STARTS:
        result = minimize(
            _objective, np.array(start, dtype=float), args=data, method="L-BFGS-B", bounds=BOUNDS
        )
        if best is None or result.fun < best[0]:
            best = (result.fun, result.x)
    assert best is not None
    a, b, e, alpha, beta = best[1]
    return Law(E=math.exp(e), A=math.exp(a), alpha=float(alpha), B=math.exp(b), beta=float(beta))


def bootstrap(
    parameters: np.ndarray,
    tokens: np.ndarray,
    losses: np.ndarray,
    law: Law,
    samples: int = 200,
    seed: int = 0,
) -> list[Law]:
    """Laws fitted to `samples` resamplings of the points (with replacement), each started from `law`
    and a few of the grid's starts: the spread of what the points can claim."""
    draw = np.random.default_rng(seed)
    start = (math.log(law.A), math.log(law.B), math.log(law.E), law.alpha, law.beta)
    starts = [start, *STARTS[:: max(1, len(STARTS) // 8)]]
    laws = []
    for _ in range(samples):
        pick = draw.integers(0, len(losses), len(losses))
        if len(set(pick.tolist())) < 6:  # fewer distinct points than the law has coefficients, and one
            continue
        laws.append(fit(parameters[pick], tokens[pick], losses[pick], starts))
    return laws
