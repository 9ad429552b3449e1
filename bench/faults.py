"""Fault tolerance in figures: kills survived / tried, bad inputs rejected cleanly / tried, mean work lost
per kill in steps (against the checkpoint interval).

    .venv/bin/python bench/faults.py [--kills 8] [--seed 0]

A kill is survived when the next `--resume` run continues from a checkpoint at most two checkpoint
intervals behind the last step the killed run reported (checkpoints are written in the background: a
kill inside a write loses its interval and the steps run beside it, at most one more interval, since
the next save waits for the write), and the series ends with final weights equal,
bit for bit, to an uninterrupted run's. A bad input is rejected cleanly when `gptpipe` exits non-zero
with one `error:` line naming it, no traceback, and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bad_inputs.cases import ALL_CASES
from bad_inputs.support import assert_rejected_cleanly, run_case
from fault_support import CHECKPOINT_EVERY, kill_and_resume


def kills(workdir: Path, count: int, seed: int) -> dict[str, float]:
    started = time.perf_counter()
    report = kill_and_resume(workdir, seed=seed, kills=count)
    lost = report.work_lost()
    survived = sum(
        1
        for killed, after, steps in zip(report.attempts, report.attempts[1:], lost, strict=False)
        if killed.returncode == -9 and steps <= 2 * CHECKPOINT_EVERY and after.returncode in (0, -9)
    )
    if not report.identical:
        survived = 0  # resumed runs that drift from the uninterrupted one survived nothing
    return {
        "kills_tried": len(report.kills),
        "kills_survived": survived,
        "final_weights_identical": report.identical,
        "work_lost_steps": lost,
        "mean_work_lost_steps": sum(lost) / len(lost) if lost else 0.0,
        "checkpoint_interval_steps": CHECKPOINT_EVERY,
        "seconds": time.perf_counter() - started,
    }


def bad_inputs(workdir: Path) -> dict[str, object]:
    def clean(case: object) -> bool:
        try:
            assert_rejected_cleanly(case, run_case(case, workdir / case.id))
        except AssertionError:
            return False
        return True

    with ThreadPoolExecutor(max_workers=4) as pool:
        verdicts = list(pool.map(clean, ALL_CASES))
    return {
        "bad_inputs_tried": len(ALL_CASES),
        "bad_inputs_rejected_cleanly": sum(verdicts),
        "not_clean": [case.id for case, ok in zip(ALL_CASES, verdicts, strict=True) if not ok],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        figures = kills(Path(folder) / "kills", args.kills, args.seed)
        rejected = bad_inputs(Path(folder) / "bad")
    print(f"kills survived / tried:             {figures['kills_survived']} / {figures['kills_tried']}")
    print(f"final weights equal uninterrupted:  {figures['final_weights_identical']}")
    print(
        f"mean work lost per kill:            {figures['mean_work_lost_steps']:.2f} steps "
        f"(checkpoint interval {CHECKPOINT_EVERY}; per kill {figures['work_lost_steps']})"
    )
    print(
        f"bad inputs rejected cleanly / tried: {rejected['bad_inputs_rejected_cleanly']} / "
        f"{rejected['bad_inputs_tried']}"
    )
    print(json.dumps({"event": "faults", **figures, **rejected}))


if __name__ == "__main__":
    main()
