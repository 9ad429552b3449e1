"""A scaling study's measured points: one finished run each, under the names its MLflow run logs them by,
and which of its parameter counts the law is fitted on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from gptcore.model.size import ModelSize

ParameterKindName = Literal["total", "non_embedding"]


@dataclass(frozen=True)
class ScalingPoint:
    """One run of the grid: its place (depth, budget), its size, what it trained on, what it measured."""

    depth: int
    max_flops: float  # the grid's budget the run was given
    parameter_count: int
    non_embedding_parameter_count: int
    tokens_seen: int
    training_flops: float
    test_bits_per_byte: float
    tokens_per_step: int = 0  # the global batch's tokens: the grid's runs all train the same
    tokens_per_second: float | None = None  # the training's steady rate, for a budget in seconds

    @property
    def flops_per_second(self) -> float | None:
        if not self.tokens_per_second or not self.tokens_seen:
            return None
        return self.tokens_per_second * self.training_flops / self.tokens_seen


@dataclass(frozen=True)
class ParameterKind:
    """Which N the law reads: every parameter (Chinchilla's count) or the non-embedding ones (Kaplan's;
    at a few million parameters the embedding is most of the model and costs a matmul a token)."""

    name: ParameterKindName

    def of(self, size: ModelSize | ScalingPoint) -> int:
        if self.name == "total":
            return size.parameter_count
        return size.non_embedding_parameter_count


def arrays(points: list[ScalingPoint], kind: ParameterKind) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(N, D, L) of the points, as the fit takes them."""
    return (
        np.array([kind.of(p) for p in points], dtype=float),
        np.array([p.tokens_seen for p in points], dtype=float),
        np.array([p.test_bits_per_byte for p in points], dtype=float),
    )
