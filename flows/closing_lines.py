"""The few lines a person reads when a run ends at a terminal: what ran, where the model is, how good it
is on text it never saw, and the commands that show more. Scripts (a pipe, `--json`) get the JSON line.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flows.run_report import RunReport, StageLine
    from tasks.results import Figure


def closing_lines(report: RunReport, links: dict[str, str], params_path: str | None) -> list[str]:
    """The run's end in words, from the run's report and the tracking links."""
    stages = report.stages
    gptpipe = invoked_as()
    lines = [_stage_line(stages)]
    failed = next((stage for stage in stages if stage.state == "failed"), None)
    if failed is not None:
        lines.append(f"Stopped: stage {failed.name} failed: {failed.message or ''}")
        lines.append("Run the same command again to resume: finished stages come from the cache.")
    evaluate = _done(report, "evaluate")
    if evaluate is not None:
        lines += _model_lines(evaluate)
    full = _done(report, "full")
    best = next((path for path in full.outputs if path.endswith("best.pt")), None) if full else None
    if best is not None:
        lines.append(f"Weights:   {_shown(best)}")
    quantize = _done(report, "quantize")
    if quantize is not None:
        table = next((path for path in quantize.outputs if path.endswith(".md")), None)
        lines.append(f"Quantized: each method's size, quality and speed in {_shown(table)}")
    run = links.get("MLflow run")
    opened = f"   then open {run}" if run else ""
    lines.append(f"See it:    {gptpipe} ui{_which_params(params_path)}{opened}")
    figures = evaluate.figures if evaluate is not None else {}
    if figures.get("registered_model"):
        uri = _model_uri(figures)
        lines.append(f'Try it:    {gptpipe} generate --model {uri} --prompt "def main("')
    lines.append("Every stage's outputs and figures as one JSON line: add --json")
    return lines


def _stage_line(stages: list[StageLine]) -> str:
    counts: dict[str, int] = {}
    for stage in stages:
        counts[stage.state] = counts.get(stage.state, 0) + 1
    seconds = sum(stage.seconds for stage in stages)
    told = ", ".join(f"{count} {state}" for state, count in counts.items())
    return f"gptpipe: {len(stages)} stages ({told}), {_duration(seconds)} in the stages."


def _model_lines(evaluate: StageLine) -> list[str]:
    figures, outputs = evaluate.figures, evaluate.outputs
    lines = []
    if figures.get("registered_model"):
        alias, version = figures.get("alias"), figures.get("model_version")
        refused = figures.get("not_compared")  # measured on another test split than the champion's
        lost = refused or "it did not beat the champion's test bits per byte"
        why = "" if alias == "champion" else f", @{alias}: {lost}"
        lines.append(f"Model:     {_model_uri(figures)} (version {version}{why})")
    bits = figures.get("test_bits_per_byte")
    if isinstance(bits, int | float):
        baseline = figures.get("unigram_test_bits_per_byte")
        against = f" (a unigram model: {baseline:.3f})" if isinstance(baseline, int | float) else ""
        tokens = figures.get("test_tokens")
        held_out = f" on {tokens:,} held-out test tokens" if isinstance(tokens, int) else ""
        lines.append(f"Test:      {bits:.3f} bits per byte{held_out}{against}")
    samples = next((path for path in outputs if path.endswith(".md")), None)
    if samples is not None:
        lines.append(f"Samples:   {_shown(samples)}")
    return lines


def _model_uri(figures: dict[str, Figure]) -> str:
    """The version by its alias when it holds one that follows it (champion), else by number."""
    name, alias = figures["registered_model"], figures.get("alias")
    version = figures.get("model_version")
    return f"models:/{name}@{alias}" if alias == "champion" else f"models:/{name}/{version}"


def _done(report: RunReport, name: str) -> StageLine | None:
    found = report.stage(name)
    return found if found is not None and found.done else None


def invoked_as() -> str:
    """The command as this person typed it: `gptpipe` when the shell finds this one, else its path
    relative to here (`.venv/bin/gptpipe` after `make run`)."""
    argv0 = Path(sys.argv[0])
    if argv0.name != "gptpipe":
        return "gptpipe"
    found = shutil.which("gptpipe")
    if found is not None and Path(found).resolve() == argv0.resolve():
        return "gptpipe"
    return _shown(str(argv0))


def _shown(path: str | None) -> str:
    """`path` relative to the working directory when it lies under it (shorter to read and to paste)."""
    if path is None:
        return "?"
    try:
        return os.path.relpath(path) if Path(path).resolve().is_relative_to(Path.cwd()) else path
    except ValueError:
        return path


def _which_params(params_path: str | None) -> str:
    """The flags that name this run's parameters to another command: none for iteration 1's file,
    `--iteration N` for another iteration's, else `--params PATH`."""
    from tasks.params.loading import PARAMS_DIR

    if params_path is None:
        return ""
    path = Path(params_path).resolve()
    numbered = re.fullmatch(r"iteration_(\d+)\.yaml", path.name)
    if numbered is not None and path.parent == PARAMS_DIR.resolve():
        return "" if numbered[1] == "1" else f" --iteration {numbered[1]}"
    return f" --params {shlex.quote(_shown(params_path))}"


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"
