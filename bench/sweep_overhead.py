"""A 2x2 sweep against the same four trials as separate `gptpipe run`s, back to back on this machine.

Each side has a Prefect home (task cache) and checkpoint folders of its own, and both share a scratch
MLflow store, so neither takes a stage from the other's cache: each builds the data stages once (the
sweep up front, the separate runs in the first run) and trains its four trials.
The trials are iteration 1 with a shortened full training (`--steps`, default 60) and evaluation (the
test split's first 65,536 tokens) over
`full.optimizer.learning_rate` x `runtime.batch_size`. Prints each side's wall time and their ratio.

    .venv/bin/python bench/sweep_overhead.py [--steps 60] [--parallel 1]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPTPIPE = [sys.executable, "-c", "import sys; from flows.cli.main import main; sys.exit(main(sys.argv[1:]))"]
RATES, BATCHES = ("1e-3", "2e-3"), ("4", "8")


def gptpipe(home: Path, *args: str) -> float:
    """Seconds one `gptpipe` command took with its Prefect home (its task cache) in `home`."""
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(home / "storage"),
    }
    env.pop("PREFECT_API_URL", None)  # a temporary server per command, as a person running them gets
    started = time.perf_counter()
    done = subprocess.run([*GPTPIPE, *args], cwd=REPO, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"gptpipe {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="full-training steps of each trial")
    parser.add_argument("--parallel", type=int, default=1, help="the sweep's trials at once")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gptpipe-sweep-bench-") as scratch:
        root = Path(scratch)

        def settings(side: str) -> list[str]:
            return [
                "--set", f"full.max_steps={args.steps}", "--set", "full.eval_every=1000",
                "--set", "evaluate.max_tokens=65536",
                "--set", f"paths.checkpoint_root={root / side}",
                "--set", f"tracking.uri=sqlite:///{root / 'mlflow.db'}",
                "--set", f"tracking.artifact_root={root / 'artifacts'}",
            ]  # fmt: skip

        grid = [
            "--grid",
            f"full.optimizer.learning_rate={','.join(RATES)}",
            "--grid",
            f"runtime.batch_size={','.join(BATCHES)}",
        ]
        swept = gptpipe(
            root / "home-sweep", "sweep", *settings("sweep"), *grid, "--parallel", str(args.parallel)
        )
        separate = 0.0
        for rate, batch in itertools.product(RATES, BATCHES):
            trial = ["--set", f"full.optimizer.learning_rate={rate}", "--set", f"runtime.batch_size={batch}"]
            side = settings("runs")  # one checkpoint root: the first run's data stages serve the others
            separate += gptpipe(root / "home-runs", "run", *side, *trial, "--until", "evaluate")
    print(
        json.dumps(
            {
                "trials": 4,
                "full_steps": args.steps,
                "parallel": args.parallel,
                "sweep_seconds": round(swept, 1),
                "separate_runs_seconds": round(separate, 1),
                "sweep_over_separate": round(swept / separate, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
