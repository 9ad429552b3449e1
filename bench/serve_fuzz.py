"""The server's bodies fuzzed at length: tests/test_serving_fuzz.py with many more drawn bodies per endpoint
than `make test` draws (50), each answered a 2xx or a 4xx with one sentence, never a 5xx, a hang or a
traceback, and a fixed request after them answered as before. Prints what pytest prints and the bodies a
second per endpoint; a failure names the smallest body Hypothesis found.

    .venv/bin/python bench/serve_fuzz.py [--examples 2000] [--seed 20261208]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="bodies drawn per endpoint")
    parser.add_argument("--seed", type=int, default=20261208, help="Hypothesis' seed: another draws others")
    args = parser.parse_args()
    env = {**os.environ, "GPTPIPE_FUZZ_EXAMPLES": str(args.examples), "GPTPIPE_FUZZ_SEED": str(args.seed)}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_serving_fuzz.py"],
        cwd=REPO,
        env=env,
    )
    seconds = time.perf_counter() - started
    print(f"{3 * args.examples} bodies (3 endpoints x {args.examples}, seed {args.seed}) in {seconds:.0f} s: "
          f"{3 * args.examples / seconds:.1f} a second")  # fmt: skip
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
