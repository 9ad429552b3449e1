"""A sweep's trials: each one the parameter file with some keys overridden, as `--set` would.

- a grid: every combination of each key's values (`--grid full.optimizer.learning_rate=1e-3,2e-3`);
- random search (`random: N`, `seed`): N combinations, each key's value drawn from its list, or from a
  range `low..high` log-uniformly (learning rates and weight decays span decades).

Every trial is validated as a whole parameter file before anything runs; a bad one is one line naming
the trial, its overrides and what the parameter file's validation said.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gptcore.errors import ConfigError
from tasks.params.loading import ParamsLoader, load_params
from tasks.params.schema import PipelineParams, SweepConfig

RANGE = re.compile(r"^\s*([-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?)\s*\.\.\s*([-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?)\s*$")


@dataclass(frozen=True)
class Trial:
    """One combination: its number (from 1) and the value of each swept key."""

    number: int
    values: dict[str, Any]
    label: str | None = None  # a name of its own (a scaling study's `d3-1e+13`), else trial-NN

    @property
    def name(self) -> str:
        return self.label or f"trial-{self.number:02d}"

    def overrides(self) -> list[str]:
        """The `--set` assignments that make this trial."""
        return [f"{key}={_text(value)}" for key, value in self.values.items()]

    def describe(self) -> str:
        return " ".join(self.overrides())


def _text(value: Any) -> str:
    """A value as `--set` reads it back (YAML), the same value again."""
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip().removesuffix("\n...").strip()


def parse_grid(options: list[str]) -> dict[str, list[Any] | str]:
    """`--grid key=a,b,c` (values read as YAML, as `--set` reads them) or `--grid key=low..high`."""
    grid: dict[str, list[Any] | str] = {}
    for option in options:
        key, sep, raw = option.partition("=")
        if not sep or not key.strip() or not raw.strip():
            raise ConfigError(f"--grid {option!r}: expected key.path=a,b,c or key.path=low..high")
        if RANGE.match(raw):
            grid[key.strip()] = raw.strip()
            continue
        values = [_value(part) for part in raw.split(",") if part.strip()]
        if not values:
            raise ConfigError(f"--grid {option!r}: no values after '='")
        grid[key.strip()] = values
    return grid


def _value(raw: str) -> Any:
    try:
        return yaml.load(raw, Loader=ParamsLoader)
    except yaml.YAMLError:
        return raw.strip()


def with_options(config: SweepConfig, **options: Any) -> SweepConfig:
    """The parameter file's sweep with the command line's options (`grid`, `random`, `seed`, `parallel`)
    where they are given."""
    return config.model_copy(update={key: value for key, value in options.items() if value is not None})


def expand(config: SweepConfig) -> list[Trial]:
    """The trials `config` describes: the grid's every combination, or `random` seeded draws."""
    if not config.grid:
        raise ConfigError("sweep.grid: no keys to sweep (give --grid key=a,b or a sweep: grid: section)")
    if config.random is None:
        ranges = [key for key, values in config.grid.items() if isinstance(values, str)]
        if ranges:
            raise ConfigError(
                f"sweep.grid.{ranges[0]} {config.grid[ranges[0]]!r}: a range is drawn from by random search; "
                "give --random N, or list the values"
            )
        keys = list(config.grid)
        combinations = itertools.product(*(config.grid[key] for key in keys))
        return [
            Trial(number, dict(zip(keys, values, strict=True)))
            for number, values in enumerate(combinations, 1)
        ]
    draw = random.Random(config.seed)
    return [
        Trial(number, {key: _draw(draw, key, values) for key, values in config.grid.items()})
        for number in range(1, config.random + 1)
    ]


def _draw(draw: random.Random, key: str, values: list[Any] | str) -> Any:
    if not isinstance(values, str):
        return draw.choice(values)
    match = RANGE.match(values)
    if match is None:
        raise ConfigError(f"sweep.grid.{key} {values!r}: expected a list of values or low..high")
    low, high = float(match.group(1)), float(match.group(2))
    if not 0 < low < high:
        raise ConfigError(f"sweep.grid.{key} {values!r}: a log-uniform range needs 0 < low < high")
    return float(
        f"{math.exp(draw.uniform(math.log(low), math.log(high))):.3g}"
    )  # 3 digits: a readable run name


def validate_trials(path: Path, base: list[str], trials: list[Trial]) -> list[PipelineParams]:
    """Each trial's parameters (the file, `base` overrides, then the trial's), all checked before any
    runs; the first bad one is a ConfigError naming the trial."""
    checked = []
    for trial in trials:
        try:
            checked.append(load_params(path, [*base, *trial.overrides()]))
        except ConfigError as error:
            raise ConfigError(f"sweep {trial.name} ({trial.describe()}): {error}") from None
    return checked
