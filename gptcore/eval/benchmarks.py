"""Standard benchmarks through EleutherAI's lm-evaluation-harness: the field's figures, not ours.

The model is written as a Hugging Face GPT-2 folder (`gptcore.export.hf`) and scored by the harness's
own `HFLM` and `simple_evaluate`, so acc, acc_norm and their stderr are computed exactly as everyone
who quotes them computes them. Tasks are the harness's (hellaswag, arc_easy, lambada_openai, piqa: their
datasets come from the Hugging Face hub) or defined in its YAML format in a folder of one's own
(`include_path`; data files named in them are read relative to that folder). A task the harness does
not know, or whose dataset cannot be reached, is one line naming it and what it needs.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptcore.errors import ConfigError, DataError, first_line
from gptcore.model.gpt import GPT

# What each figure is called in MLflow and in the registry's tags: `<task>/<metric>`.
SAMPLES = "samples"


@dataclass(frozen=True)
class BenchmarkRequest:
    """Which tasks and how: the harness's own options."""

    tasks: tuple[str, ...]
    include_path: Path | None = None
    limit: int | None = None  # the first N examples of each task (None: all)
    num_fewshot: int | None = None  # None: each task's own default
    batch_size: int = 8


def run_benchmarks(model: GPT, tokenizer: Path, request: BenchmarkRequest) -> dict[str, dict[str, float]]:
    """Each task's figures: {task: {metric: value, "<metric>_stderr": ..., "samples": n}}."""
    from gptcore.export.hf import export_hf

    with tempfile.TemporaryDirectory(prefix="gptpipe-benchmark-") as scratch:
        folder = export_hf(model.to("cpu").eval(), tokenizer, Path(scratch) / "hf")
        return _evaluate(folder, request)


def _evaluate(folder: Path, request: BenchmarkRequest) -> dict[str, dict[str, float]]:
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    manager = _task_manager(request)
    unknown = [task for task in request.tasks if not manager.match_tasks([task])]
    if unknown:
        where = f" nor in {request.include_path}" if request.include_path else ""
        raise ConfigError(
            f"--tasks {','.join(unknown)}: not a task lm-evaluation-harness knows{where} "
            "(lm-eval ls tasks lists them; --include-path DIR adds YAML tasks of your own)"
        )
    language_model = HFLM(pretrained=str(folder), device="cpu", batch_size=request.batch_size)
    with _inside(request.include_path), _hub_named(request.tasks):
        results = simple_evaluate(
            model=language_model,
            tasks=list(request.tasks),
            task_manager=manager,
            limit=request.limit,
            num_fewshot=request.num_fewshot,
            log_samples=False,
        )
    return {task: _figures(results["results"][task], results["n-samples"][task]) for task in request.tasks}


def _task_manager(request: BenchmarkRequest) -> Any:
    """The harness's index of tasks: the folder's alone when it defines every task asked for (indexing
    the harness's own thousands takes ~10 s), else the folder's and the harness's."""
    from lm_eval.tasks import TaskManager

    include = str(request.include_path.resolve()) if request.include_path else None
    if include is not None:
        local = TaskManager(include_path=include, include_defaults=False)
        if all(local.match_tasks([task]) for task in request.tasks):
            return local
    return TaskManager(include_path=include)


def _figures(raw: dict[str, Any], samples: dict[str, int]) -> dict[str, float]:
    """The harness's `acc,none` / `acc_stderr,none` as `acc` / `acc_stderr`, and the samples scored."""
    figures = {}
    for key, value in raw.items():
        metric, _, _filter = key.partition(",")
        if _filter and isinstance(value, int | float) and not isinstance(value, bool):
            figures[metric] = float(value) if math.isfinite(value) else math.nan
    figures[SAMPLES] = float(samples.get("effective", samples.get("original", 0)))
    return figures


@contextlib.contextmanager
def _inside(folder: Path | None) -> Iterator[None]:
    """Data files a YAML task names are read relative to its folder."""
    if folder is None:
        yield
        return
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


@contextlib.contextmanager
def _hub_named(tasks: tuple[str, ...]) -> Iterator[None]:
    """A dataset the hub must give and does not: one line naming the tasks and what they need."""
    try:
        yield
    except (ConnectionError, OSError, ValueError) as error:
        reason = first_line(error)[:300]
        raise DataError(
            f"--tasks {','.join(tasks)}: a dataset they read could not be loaded ({reason}); "
            "the harness's own tasks download theirs from the Hugging Face hub: run where it is reachable, "
            "or define the task over local files (--include-path)"
        ) from None
