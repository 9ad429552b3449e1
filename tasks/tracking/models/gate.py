"""`evaluate.benchmark_gate`: the champion rule's second condition. A version takes `@champion` with
better test bits per byte only when it also did not regress on one named benchmark figure
(`<task>/<metric>`, a tag of every version scored on it) against the champion it would replace.

The gate judges against the champion read at registration; a version it holds back is registered as
`challenger` with `may_hold_champion=false` and the reason as its `benchmark_gate` tag, so it never takes
`@champion` later either. A champion scored on no such figure (registered before the benchmark was
listed) cannot be regressed from: the gate passes, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PASSED = "passed"


@dataclass(frozen=True)
class BenchmarkGate:
    figure: str  # <task>/<metric>
    value: float  # this version's
    higher_is_better: bool  # as the task's YAML says of the metric

    def refusal(self, champion: Any) -> str | None:
        """Why this version may not replace `champion` (a model version, or None), or None when it may."""
        theirs = _value(champion, self.figure)
        if theirs is None:
            return None
        worse = self.value < theirs if self.higher_is_better else self.value > theirs
        if not worse:
            return None
        return (
            f"{self.figure} {self.value:.6g} regressed from champion version {champion.version}'s "
            f"{theirs:.6g}: may not take @champion"
        )

    def verdict(self, champion: Any) -> str:
        """The version's `benchmark_gate` tag: the refusal, or what it passed against."""
        refusal = self.refusal(champion)
        if refusal is not None:
            return refusal
        theirs = _value(champion, self.figure)
        against = "no champion scored on it" if theirs is None else f"the champion's {theirs:.6g}"
        return f"{PASSED}: {self.figure} {self.value:.6g} against {against}"


def _value(version: Any, figure: str) -> float | None:
    try:
        return float(version.tags[figure]) if version is not None else None
    except (KeyError, ValueError):
        return None
