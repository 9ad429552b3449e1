"""A sweep's trials: one trial's result, running one in a process of its own, and the table of them.
The sweep flow (`flows.sweep`) runs them here, or on a work pool's workers (`flows.sweep_pool`)."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from flows.run_report import RunReport
from gptcore.errors import ConfigError
from gptcore.tools.markdown import table
from gptcore.tools.records import JSONObject
from tasks.params.sweep import Trial
from tasks.tracking import ParentRun, TrackingSession

FIGURES = ("test_bits_per_byte", "final_val_loss", "tokens_per_second")  # the table's columns


@dataclass(frozen=True)
class TrialRow:
    """A trial's line of the sweep's table, under the names MLflow's table gives its columns: the trial,
    its overrides, its figures (FIGURES, then the benchmarks': a column each), state, seconds, message."""

    trial: str
    overrides: str
    figures: dict[str, float | None]  # by column name: `test_bits_per_byte`, `hellaswag/acc_norm`, ...
    state: str
    seconds: float
    message: str

    def to_dict(self) -> JSONObject:
        """The row as MLflow's table and the sweep's JSON take it: each figure a column of its own."""
        head: JSONObject = {"trial": self.trial, "overrides": self.overrides}
        return {**head, **self.figures, "state": self.state, "seconds": self.seconds, "message": self.message}


@dataclass
class TrialResult:
    trial: Trial
    state: str = "pending"  # completed, failed
    figures: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    message: str = ""

    def row(self, benchmarks: list[str] | None = None) -> TrialRow:
        """The trial's line of the table: FIGURES, then the `benchmarks` figures (`<task>/<metric>`)."""
        figures = {key: self.figures.get(key) for key in [*FIGURES, *(benchmarks or [])]}
        return TrialRow(
            self.trial.name, self.trial.describe(), figures, self.state, round(self.seconds, 1), self.message
        )


TRIAL_PROGRAM_VARIABLE = "GPTPIPE_TRIAL_PROGRAM"


def gptpipe_program() -> list[str]:
    """The command a trial runs as `gptpipe`: GPTPIPE_TRIAL_PROGRAM where set, split as a shell splits it
    (a wrapper such as `nice -n 10 gptpipe`, or a program elsewhere); else the installed `gptpipe`
    (pyproject's `[project.scripts]`), the one beside this interpreter (a virtual environment's), else
    the one on PATH. A trial is a `gptpipe run`, as a person would type it."""
    from gptcore.tools.programs import configured_program

    configured = configured_program(TRIAL_PROGRAM_VARIABLE)
    if configured:
        return configured
    beside = Path(sys.executable).with_name("gptpipe")
    found = str(beside) if beside.is_file() else shutil.which("gptpipe")
    if found is None:
        raise ConfigError(
            f"gptpipe: the program is installed neither beside {sys.executable} nor on PATH; "
            "install the project (make setup, or pip install -e .) to run a sweep's trials"
        )
    return [found]


def run_trial(
    params_path: str, base: list[str], trial: Trial, parent_run_id: str | None, cancel: threading.Event
) -> TrialResult:
    """One trial as `gptpipe run --until evaluate` in a process of its own; its report's figures."""
    from gptcore.tools.processes import run_process_tree

    started = time.time()
    result = TrialResult(trial)
    overrides = [item for assignment in [*base, *trial.overrides()] for item in ("--set", assignment)]
    description = {"parent_run_id": parent_run_id, "name": trial.name, "values": trial.values}
    command = [*gptpipe_program(), "run", "--params", params_path, *overrides, "--until", "evaluate"]
    command += ["--trial", json.dumps(description)]
    lines: list[str] = []

    def relay(line: str) -> None:
        lines.append(line)
        if not line.startswith('{"stages"'):
            print(f"[{trial.name}] {line}", file=sys.stderr, flush=True)

    code = run_process_tree(command, relay, cancel=cancel)
    result.seconds = time.time() - started
    report = next((line for line in reversed(lines) if line.startswith('{"stages"')), None)
    result.figures = RunReport.model_validate_json(report).headline() if report else {}
    result.state = "completed" if code == 0 else "failed"
    if code != 0:
        errors = [line for line in lines if line.startswith("error:")]
        result.message = (errors[-1] if errors else f"exit code {code}")[:300]
    return result


def benchmark_columns(results: list[TrialResult]) -> list[str]:
    """The benchmark figures any trial scored (`evaluate.benchmarks`), in a stable order."""
    from gptcore.eval.benchmarks import is_headline

    return sorted({name for result in results for name in result.figures if is_headline(name)})


def sweep_table(results: list[TrialResult]) -> str:
    benchmarks = benchmark_columns(results)
    header = ["trial", "overrides", "test bits/byte", "val loss", "tokens/s", *benchmarks, "state", "seconds"]
    rows = []
    for result in results:
        row = result.row(benchmarks)
        state = row.state + (f": {row.message}" if row.message else "")
        rows.append([row.trial, row.overrides, *row.figures.values(), state, row.seconds])
    return table(header, rows)


@dataclass(frozen=True)
class TableRun:
    """Where a table of runs side by side goes: the MLflow run that holds them (`log_table` as `file`,
    and `<title>` as markdown), a Prefect table artifact `key`, and the terminal."""

    session: TrackingSession
    run_id: str | None
    title: str
    file: str
    key: str

    def publish(self, rows: list[JSONObject], markdown: str, done: bool, description: str) -> None:
        """Print and record the table; end the run, FINISHED when `done`."""
        print(f"\n{markdown}\n", file=sys.stderr, flush=True)
        if self.run_id is not None:
            run = ParentRun(self.session, self.run_id)
            run.log_table(rows, self.file)
            run.log_text(f"# {self.title}\n\n{markdown}\n", self.file.replace(".json", ".md"))
            run.finish(done)
        try:
            from prefect.artifacts import create_table_artifact

            create_table_artifact(rows, key=self.key, description=description)
        except Exception as error:  # a convenience, never a reason to fail the run
            print(f"warning: {self.key} table artifact not created: {error}", file=sys.stderr)
