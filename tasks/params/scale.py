"""A scaling study in parameter-file terms: its grid as trials (each a depth of the size dial at a FLOPs
budget, as `--set` would make it), the candidates a budget could buy, and the planned run's parameter
file, written from the study's file with the chosen depth, budget and prediction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gptcore.errors import ConfigError
from gptcore.model.size import ModelSize
from gptcore.scaling.plan import (
    MAX_EXTRAPOLATION,
    MIN_BUDGETS,
    MIN_POINTS,
    MIN_SIZES,
    Budget,
    Candidate,
    Planned,
)
from gptcore.scaling.points import ScalingPoint
from gptcore.tools.atomic import write_text_atomic
from tasks.params.loading import load_params, read_yaml
from tasks.params.schema import PipelineParams, ScaleConfig
from tasks.params.sweep import Trial

WARMUP_SHARE = 0.05  # every run of the study warms up over the same share of its steps


def registered_model(params: PipelineParams, settings: ScaleConfig) -> str:
    """Where the grid's models register: apart from the iteration's own, whose champion they must not
    take (a grid's small models are measurements, not candidates)."""
    return settings.registered_model or f"gptpipe-iteration-{params.iteration}-scaling"


def shared_overrides(params: PipelineParams, settings: ScaleConfig) -> list[str]:
    """What every point of the grid, and the planned run, set: the budget alone decides the length
    (no step cap), warmup a share of the steps."""
    return [
        "full.max_steps=null",
        f"full.optimizer.warmup_share={WARMUP_SHARE}",
        f"tracking.registered_model={registered_model(params, settings)}",
    ]


def grid_trials(settings: ScaleConfig) -> list[Trial]:
    """Every depth at every budget, smallest budget first, named `d<depth>-<budget>`."""
    points = [(budget, depth) for budget in sorted(settings.budgets) for depth in sorted(settings.depths)]
    return [
        Trial(number, {"model.depth": depth, "full.max_flops": budget}, label=f"d{depth}-{budget:.3g}")
        for number, (budget, depth) in enumerate(points, 1)
    ]


def study_settings(section: ScaleConfig, options: dict[str, Any]) -> ScaleConfig:
    """The file's `scale:` section with the command line's options where given, validated again."""
    given = {key: value for key, value in options.items() if value is not None}
    return ScaleConfig.model_validate(section.model_dump() | given)


def target_budget(settings: ScaleConfig) -> Budget:
    """The planned run's budget, refused now (before anything trains) when the grid cannot claim it."""
    if settings.target_seconds is not None:
        return Budget(seconds=settings.target_seconds)
    largest = max(settings.budgets)
    flops = settings.target_flops or 4 * largest
    if flops > MAX_EXTRAPOLATION * largest:
        raise ConfigError(
            f"scale.target_flops {flops:.3g}: {flops / largest:.0f}x the grid's largest budget "
            f"({largest:.3g}); the fit claims at most {MAX_EXTRAPOLATION:g}x: add a larger budget to "
            "scale.budgets"
        )
    sizes, budgets = len(set(settings.depths)), len(set(settings.budgets))
    if sizes * budgets < MIN_POINTS or sizes < MIN_SIZES or budgets < MIN_BUDGETS:
        raise ConfigError(
            f"scale: too few points to fit: {sizes} depths x {budgets} budgets; the law's five coefficients "
            f"need at least {MIN_POINTS} runs over {MIN_BUDGETS} budgets of {MIN_SIZES} depths (add to "
            "scale.depths or scale.budgets)"
        )
    return Budget(flops=flops)


def dial_size(params: PipelineParams, depth: int) -> ModelSize:
    """The size of the study's model at `depth` of the dial (as `--set model.depth=` would make it)."""
    return ModelSize.of(params.model_profile().at_depth(depth))


def candidates(params: PipelineParams, points: list[ScalingPoint], most: int) -> list[Candidate]:
    """The grid's smallest depth to `most` on the dial (never below the smallest the points measured:
    the law is not asked about sizes under them), each with the training FLOP/s measured at the nearest
    depth of the grid (a budget in seconds is priced by them)."""
    rates = {p.depth: p.flops_per_second for p in points if p.flops_per_second}
    found = []
    for depth in range(min(p.depth for p in points), most + 1):
        nearest = min(rates, key=lambda measured: (abs(measured - depth), -measured)) if rates else None
        found.append(Candidate(depth, dial_size(params, depth), rates.get(nearest)))
    return found


def write_planned(source: Path, base: list[str], planned: Planned, run_id: str | None, target: Path) -> Path:
    """The planned run's parameter file: the study's file with the chosen depth on the dial, the budget
    in FLOPs (no step cap), the study's warmup share and the prediction; checked by loading it back."""
    data: dict[str, Any] = read_yaml(source)
    params = load_params(source, [*base, f"model.depth={planned.depth}"])
    profile = params.model_profile()
    data.pop("scale", None)
    shape = profile.architecture
    data["model"] = {
        "depth": planned.depth,
        "recipe": profile.recipe,
        "architecture": {"vocab_size": shape.vocab_size, "block_size": shape.block_size},
        "cpu": profile.cpu.model_dump(exclude_defaults=True),
        "gpu": profile.gpu.model_dump(exclude_defaults=True),
    }
    full = data.setdefault("full", {})
    full.update({"max_flops": planned.max_flops, "max_steps": None})
    full.setdefault("optimizer", {})["warmup_share"] = WARMUP_SHARE
    data["prediction"] = {
        "test_bits_per_byte": round(planned.predicted_test_bits_per_byte, 4),
        "low": round(planned.predicted_low, 4),
        "high": round(planned.predicted_high, 4),
        "scale_run_id": run_id,
    }
    header = (
        f"# Planned by `gptpipe scale` from {source.name} (MLflow run {run_id}):\n"
        f"# depth {planned.depth} of the size dial ({planned.parameter_count:,} parameters) on "
        f"{planned.tokens:,} tokens\n# ({planned.steps} steps, {planned.tokens_per_parameter:.1f} tokens per "
        f"parameter) for {planned.max_flops:.3g} FLOPs; predicted test bits per byte\n"
        f"# {planned.predicted_test_bits_per_byte:.4f} "
        f"({planned.predicted_low:.4f}-{planned.predicted_high:.4f}).\n"
        + (
            "# Within one epoch: a smaller size would do better on this budget but read the corpus again.\n"
            if planned.data_constrained
            else ""
        )
        + f"#   gptpipe run --params {target}\n"
    )
    text = header + yaml.safe_dump(data, sort_keys=False, width=100)
    write_text_atomic(target, text)
    try:
        load_params(target)  # what was written reads back as a parameter file
    except ConfigError:
        target.unlink()
        raise
    return target
