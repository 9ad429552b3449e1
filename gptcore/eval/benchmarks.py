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
from typing import TYPE_CHECKING, Any

from gptcore.errors import ConfigError, DataError, first_line
from gptcore.eval.config import EvaluateConfig
from gptcore.tools.fingerprint import sha256_bytes, sha256_file
from gptcore.tools.records import JSONObject

if TYPE_CHECKING:
    from gptcore.model.gpt import GPT

# A task's figures beside its metrics: the examples scored, and each metric's standard error.
SAMPLES = "samples"
STDERR = "_stderr"


@dataclass(frozen=True)
class BenchmarkRequest:
    """Which tasks and how: the harness's own options."""

    tasks: tuple[str, ...]
    include_path: Path | None = None
    limit: int | None = None  # the first N examples of each task (None: all)
    num_fewshot: int | None = None  # None: each task's own default
    batch_size: int = 8
    device: str = "cpu"


@dataclass(frozen=True)
class BenchmarkScores:
    """The harness's figures: {task: {metric: value, "<metric>_stderr": ..., "samples": n}}, and whether
    a higher value of each metric is better (as each task's YAML says)."""

    tasks: dict[str, dict[str, float]]
    higher_is_better: dict[str, dict[str, bool]]

    def figures(self) -> dict[str, float]:
        """Every figure under its MLflow name, `<task>/<metric>`."""
        scores = self.tasks.items()
        return {f"{task}/{metric}": value for task, metrics in scores for metric, value in metrics.items()}

    def better_when_higher(self, figure: str) -> bool:
        """Whether a higher `<task>/<metric>` is better (unknown: as accuracy is)."""
        task, _, metric = figure.partition("/")
        return self.higher_is_better.get(task, {}).get(metric, True)

    def merged(self, other: BenchmarkScores) -> BenchmarkScores:
        return BenchmarkScores(
            {**self.tasks, **other.tasks}, {**self.higher_is_better, **other.higher_is_better}
        )

    def to_dict(self) -> JSONObject:
        return {"tasks": self.tasks, "higher_is_better": self.higher_is_better}

    @classmethod
    def from_dict(cls, value: JSONObject) -> BenchmarkScores:
        return cls(value.get("tasks", {}), value.get("higher_is_better", {}))


def is_headline(figure: str) -> bool:
    """A benchmark's own metric (`hellaswag/acc_norm`), not its stderr or sample count: what tables show."""
    task, slash, metric = figure.partition("/")
    return bool(task and slash and metric) and metric != SAMPLES and not metric.endswith(STDERR)


def requests_for(settings: EvaluateConfig, device: str) -> list[BenchmarkRequest]:
    """The parameter file's `evaluate.benchmarks` as harness calls: tasks sharing a limit and a shot count
    are scored together."""
    include = Path(settings.benchmark_include_path) if settings.benchmark_include_path else None
    groups: dict[tuple[int | None, int | None], list[str]] = {}
    for benchmark in settings.benchmarks:
        groups.setdefault((benchmark.limit, benchmark.num_fewshot), []).append(benchmark.task)
    return [
        BenchmarkRequest(tuple(tasks), include, limit, shots, settings.batch_size, device)
        for (limit, shots), tasks in groups.items()
    ]


def run_benchmarks(model: GPT, tokenizer: Path, requests: list[BenchmarkRequest]) -> BenchmarkScores:
    """Every request's tasks scored on `model` (written once as a Hugging Face folder)."""
    from gptcore.export.hf import export_hf

    scores = BenchmarkScores({}, {})
    with tempfile.TemporaryDirectory(prefix="gptpipe-benchmark-") as scratch:
        folder = export_hf(model.to("cpu").eval(), tokenizer, Path(scratch) / "hf")
        for request in requests:
            scores = scores.merged(_evaluate(folder, request))
    return scores


def _evaluate(folder: Path, request: BenchmarkRequest) -> BenchmarkScores:
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    manager = known_tasks(request)
    language_model = HFLM(pretrained=str(folder), device=request.device, batch_size=request.batch_size)
    with _inside(request.include_path), _hub_named(manager, request.tasks):
        results = simple_evaluate(
            model=language_model,
            tasks=list(request.tasks),
            task_manager=manager,
            limit=request.limit,
            num_fewshot=request.num_fewshot,
            log_samples=False,
        )
    tasks = {task: _figures(results["results"][task], results["n-samples"][task]) for task in request.tasks}
    directions = {task: dict(results.get("higher_is_better", {}).get(task, {})) for task in request.tasks}
    return BenchmarkScores(tasks, directions)


def known_tasks(request: BenchmarkRequest, key: str = "--tasks", folder_key: str = "--include-path") -> Any:
    """The harness's task index, once every task asked for is in it; else a ConfigError naming those that
    are not (`key`, `folder_key`: how the caller's user names the tasks and their folder)."""
    check_folder(request.include_path, folder_key)
    manager = _task_manager(request)
    unknown = [task for task in request.tasks if not manager.match_tasks([task])]
    if unknown:
        where = f" nor in {request.include_path}" if request.include_path else ""
        raise ConfigError(
            f"{key} {','.join(unknown)}: not a task lm-evaluation-harness knows{where} "
            f"(lm-eval ls tasks lists them; {folder_key} adds a folder of YAML tasks of your own)"
        )
    return manager


def check_folder(include_path: Path | None, key: str = "--include-path") -> None:
    if include_path is not None and not include_path.is_dir():
        raise ConfigError(f"{key} {include_path}: not a folder of task YAML files")


def check_benchmarks(settings: EvaluateConfig) -> None:
    """The parameter file's benchmarks, checked before a pipeline starts: the harness installed, the
    tasks' folder there, every task known."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise ConfigError(
            "evaluate.benchmarks: lm-evaluation-harness is not installed (pip install 'gptpipe[hf]')"
        ) from None
    for request in requests_for(settings, "cpu"):
        known_tasks(request, "evaluate.benchmarks", "evaluate.benchmark_include_path")


def task_files_digest(folder: Path) -> str:
    """One sha256 over a tasks folder's files (names and contents): a changed task or data file shows."""
    check_folder(folder, "evaluate.benchmark_include_path")
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    listing = "\n".join(f"{path.relative_to(folder)} {sha256_file(path)}" for path in files)
    return sha256_bytes(listing.encode("utf-8"))


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


def _figures(raw: JSONObject, samples: dict[str, int]) -> dict[str, float]:
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
def _hub_named(manager: Any, tasks: tuple[str, ...]) -> Iterator[None]:
    """A dataset the hub must give and does not: one line naming each task and the dataset it reads."""
    try:
        yield
    except (ConnectionError, OSError, ValueError) as error:
        reason = first_line(error)[:300]
        raise DataError(
            f"--tasks {','.join(tasks)}: {_needs(manager, tasks)}, and a dataset could not be loaded "
            f"({reason}); the harness's own tasks download theirs from the Hugging Face hub: run where it "
            "is reachable, or define the task over local files (--include-path)"
        ) from None


def _needs(manager: Any, tasks: tuple[str, ...]) -> str:
    """`arc_easy needs allenai/ai2_arc, ...`: the dataset each task's YAML names."""
    named = []
    for task in tasks:
        entry = manager.task_index.get(task)
        dataset = (getattr(entry, "cfg", None) or {}).get("dataset_path")
        named.append(f"{task} needs {dataset}" if dataset else f"{task} needs its dataset")
    return ", ".join(named)
