"""A study's two pictures, as PNG files the MLflow UI shows: the loss against training FLOPs for each
size, with the frontier the law draws through them (and the planned run, with its interval and, once
run, its measurement); and the IsoFLOP curves, loss against parameters at each budget with their minima."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from gptcore.scaling.plan import Planned
from gptcore.scaling.study import Study

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def loss_against_flops(study: Study, planned: Planned | None, measured: float | None, path: Path) -> Path:
    """Each depth's runs as a line of test bits per byte over FLOPs; the law's frontier (its lowest
    loss over the grid's depths at each budget); the planned run's prediction with its interval."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    kind = study.chosen.kind
    depths = sorted({p.depth for p in study.points})
    for depth in depths:
        runs = sorted((p for p in study.points if p.depth == depth), key=lambda p: p.training_flops)
        axes.plot(
            [p.training_flops for p in runs], [p.test_bits_per_byte for p in runs], "o-", label=f"d{depth}"
        )
    spent = [p.training_flops for p in study.points]
    top = 1.5 * planned.max_flops if planned is not None else 8 * max(spent)
    budgets = np.geomspace(min(spent), max(top, max(spent)), 60)
    sizes = {p.depth: p for p in study.points}
    frontier = [
        min(study.chosen.law.loss(kind.of(point), c * point.tokens_seen / point.training_flops)
            for point in sizes.values())
        for c in budgets
    ]  # fmt: skip
    axes.plot(budgets, frontier, "k--", linewidth=1, label=f"law's frontier (N = {kind.name})")
    if planned is not None:
        value = planned.predicted_test_bits_per_byte
        errors = [[value - planned.predicted_low], [planned.predicted_high - value]]
        axes.errorbar([planned.max_flops], [value], yerr=errors, fmt="s", color="red", capsize=4,
                      label=f"planned d{planned.depth}: predicted")  # fmt: skip
    if planned is not None and measured is not None:
        axes.plot(
            [planned.max_flops], [measured], "*", color="green", markersize=12, label="planned: measured"
        )
    return _saved(figure, axes, "training FLOPs", "Loss against compute, by depth", path)


def isoflop_curves(study: Study, path: Path) -> Path:
    """At each budget, test bits per byte against parameters (the chosen count), the parabola in log N
    through them and its minimum."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    kind = study.chosen.kind
    for budget in sorted({p.max_flops for p in study.points}):
        runs = sorted((p for p in study.points if p.max_flops == budget), key=kind.of)
        n = np.array([kind.of(p) for p in runs], dtype=float)
        losses = np.array([p.test_bits_per_byte for p in runs])
        (line,) = axes.plot(n, losses, "o", label=f"{budget:.2g} FLOPs")
        if len(runs) >= 3:
            coefficients = np.polyfit(np.log(n), losses, 2)
            grid = np.geomspace(n.min(), n.max(), 50)
            axes.plot(grid, np.polyval(coefficients, np.log(grid)), "-", color=line.get_color(), linewidth=1)
    for found in study.minima:
        axes.plot([found.parameters], [found.loss], "v", color="black", markersize=7)
    return _saved(
        figure, axes, f"parameters ({kind.name})", "IsoFLOP curves (triangles: each budget's minimum)", path
    )


def _saved(figure: Figure, axes: Axes, xlabel: str, title: str, path: Path) -> Path:
    """The figure's log x axis, labels, legend and grid, written to `path` as PNG and closed."""
    axes.set_xscale("log")
    axes.set_xlabel(xlabel)
    axes.set_ylabel("test bits per byte")
    axes.set_title(title)
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3, which="both")
    figure.tight_layout()
    figure.savefig(path)
    _pyplot().close(figure)
    return path
