"""A 2x2 sweep against the same four trials as separate `gptpipe run`s, back to back on this machine.

Both sides start from built data stages (one untimed `gptpipe run --until tokens` first) and train into
fresh checkpoint folders and a scratch MLflow store, so neither takes a training from the other's cache.
The trials are iteration 1 with a shortened full training (`--steps`, default 60) and evaluation (the
test split's first 65,536 tokens) over
`full.optimizer.learning_rate` x `runtime.batch_size`. Prints each side's wall time and their ratio.

    .venv/bin/python bench/sweep_overhead.py [--steps 60] [--parallel 1]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPTPIPE = [sys.executable, "-c", "import sys; from flows.cli import main; sys.exit(main(sys.argv[1:]))"]
RATES, BATCHES = ("1e-3", "2e-3"), ("4", "8")


def gptpipe(*args: str) -> float:
    """Seconds one `gptpipe` command took; stops the bench when it fails."""
    started = time.perf_counter()
    done = subprocess.run([*GPTPIPE, *args], cwd=REPO, capture_output=True, text=True)
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

        gptpipe("run", *settings("data"), "--until", "tokens")  # untimed: both sides start from built data
        grid = [
            "--grid",
            f"full.optimizer.learning_rate={','.join(RATES)}",
            "--grid",
            f"runtime.batch_size={','.join(BATCHES)}",
        ]
        swept = gptpipe("sweep", *settings("sweep"), *grid, "--parallel", str(args.parallel))
        separate = 0.0
        for rate, batch in itertools.product(RATES, BATCHES):
            trial = ["--set", f"full.optimizer.learning_rate={rate}", "--set", f"runtime.batch_size={batch}"]
            separate += gptpipe("run", *settings(f"run-{rate}-{batch}"), *trial, "--until", "evaluate")
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
