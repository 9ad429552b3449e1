"""Running one bad-input case: lay out its files in a fresh folder, run `gptpipe` there, observe."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from process_support import FORKED_GPTPIPE

ROOT = Path(__file__).resolve().parents[2]
FileMaker = Callable[[Path], None]


@dataclass(frozen=True)
class Case:
    """`argv` after `gptpipe`; `expect` must appear in the one stderr line ({dir} is the case's folder)."""

    id: str
    argv: list[str]
    expect: str
    files: dict[str, bytes | str | FileMaker] = field(default_factory=dict)
    exit_code: int = 2


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    before: dict[str, int]
    after: dict[str, int]
    directory: Path


def _listing(directory: Path) -> dict[str, int]:
    """Every file under the folder with its size: what a run left behind."""
    return {str(p.relative_to(directory)): p.stat().st_size for p in directory.rglob("*") if p.is_file()}


def lay_out(case: Case, directory: Path) -> None:
    for name, content in case.files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def run_case(case: Case, directory: Path) -> Outcome:
    directory.mkdir(parents=True, exist_ok=True)
    lay_out(case, directory)
    before = _listing(directory)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    result = subprocess.run(
        [*FORKED_GPTPIPE, *case.argv],  # the command's own process, its imports done by the fork server
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    return Outcome(result.returncode, result.stdout, result.stderr, before, _listing(directory), directory)


def assert_rejected_cleanly(case: Case, outcome: Outcome) -> None:
    """Non-zero exit, one `error:` line naming what and where, no traceback, nothing written."""
    shown = outcome.stderr.strip()
    assert outcome.returncode == case.exit_code, (outcome.returncode, shown)
    assert "Traceback" not in outcome.stderr + outcome.stdout, outcome.stderr
    assert shown.count("\n") == 0, f"more than one line on stderr:\n{outcome.stderr}"
    assert shown.startswith("error: "), shown
    expected = case.expect.format(dir=outcome.directory)
    assert expected in shown, f"{expected!r} not in {shown!r}"
    assert outcome.after == outcome.before, "the failed command wrote or changed files"
