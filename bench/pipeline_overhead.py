"""Wall time of a fully cached `gptpipe run` and each stage's orchestration overhead beside its work.

Runs the pipeline twice on the given parameter file (default: a tiny corpus and model in a temporary
folder, so the first run is short): the first run does the work, the second is fully cached. Prints,
per stage, the seconds the stage took in the flow and the seconds its own work reported, and the
cached rerun's wall time against the 10 s target (temporary Prefect server start included).

    .venv/bin/python bench/pipeline_overhead.py [--params FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
GPTPIPE = [sys.executable, "-m", "flows.cli.main"]  # the same entry point as the `gptpipe` script
# Seconds of work each stage reports about itself, by figure name.
WORK = {
    "tokenizer": "tokenizer_seconds",
    "tokens": "tokens_seconds",
    "smoke": "elapsed_seconds",
    "full": "elapsed_seconds",
}


def run(params: Path) -> tuple[float, dict]:
    started = time.perf_counter()
    result = subprocess.run(
        [*GPTPIPE, "run", "--params", str(params)], cwd=REPO, capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    if result.returncode:
        sys.exit(f"gptpipe run failed:\n{result.stderr[-2000:]}")
    return wall, json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, help="parameter file (default: a tiny one in a temp folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gptpipe-bench-") as folder:
        params = args.params
        if params is None:
            from test_pipeline import write_corpus, write_params

            write_corpus(Path(folder))
            params = write_params(Path(folder))
        first_wall, first = run(params)
        cached_wall, cached = run(params)
    print(f"first run: {first_wall:.1f} s wall")
    for stage in first["stages"]:
        work = stage["figures"].get(WORK.get(stage["name"], ""))
        overhead = f"{stage['seconds'] - work:.2f} s" if work is not None else "-"
        name, seconds = stage["name"], stage["seconds"]
        print(f"  {name:<10} in flow {seconds:.2f} s, work {work or '-'} s, overhead {overhead}")
    states = {stage["name"]: stage["state"] for stage in cached["stages"]}
    print(f"fully cached rerun: {cached_wall:.1f} s wall, {cached_wall / 10:.2f} x the 10 s target; {states}")


if __name__ == "__main__":
    main()
