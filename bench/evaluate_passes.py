"""The evaluate stage's forward passes at several widths, paired: the test split's first tokens read in
passes of 1 to 64 windows (`evaluate.batch_size`), alternating in one process on the newest `make run`
checkpoint, so the machine's mood falls on every width alike.

Prints one JSON line a timing, then the median seconds of each width, each as a ratio of 8 windows'
(the default), and the nats each summed (equal to float rounding: every token is predicted once whatever
the width). With `--cpu-capability avx2` it runs as an AVX2-only CPU does (ATen's AVX2 kernels, oneDNN
capped at AVX2: bf16 then emulated).

    .venv/bin/python bench/evaluate_passes.py [--max-tokens 65536] [--rounds 2] [--cpu-capability avx2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WIDTHS = (1, 2, 4, 8, 16, 64)
REFERENCE = 8  # EvaluateConfig().batch_size


def newest(pattern: str) -> Path:
    found = sorted(REPO.glob(pattern), key=lambda path: path.stat().st_mtime)
    if not found:
        raise SystemExit(f"no {pattern} under {REPO}: run `make run` first")
    return found[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=65536, help="the test split's first N tokens")
    parser.add_argument("--rounds", type=int, default=2, help="timings of each width, alternating")
    parser.add_argument("--cpu-capability", choices=["avx2"], default=None)
    args = parser.parse_args()
    if args.cpu_capability and os.environ.get("ATEN_CPU_CAPABILITY") != args.cpu_capability:
        env = {**os.environ, "ATEN_CPU_CAPABILITY": args.cpu_capability, "ONEDNN_MAX_CPU_ISA": "AVX2"}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)  # both are read when torch loads

    import torch

    from gptcore.checkpoint.load import load_model
    from gptcore.data.tokenfile import open_tokens
    from gptcore.eval.held_out import summed_nats

    checkpoint = newest("checkpoints/iteration-1-full-*/best.pt")
    test = open_tokens(newest("data/tokens/*/test.manifest.json"))
    model, _ = load_model(checkpoint, "cpu")
    seconds: dict[int, list[float]] = {width: [] for width in WIDTHS}
    nats: dict[int, float] = {}
    for round_ in range(args.rounds):
        for width in WIDTHS:
            started = time.perf_counter()
            nats[width], predicted = summed_nats(model, test.tokens, width, args.max_tokens)
            seconds[width].append(time.perf_counter() - started)
            timing = {"round": round_, "windows": width, "seconds": seconds[width][-1], "tokens": predicted}
            print(json.dumps(timing), flush=True)
    medians = {width: statistics.median(values) for width, values in seconds.items()}
    print(json.dumps({
        "checkpoint": str(checkpoint.relative_to(REPO)), "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "median_seconds": medians,
        "of_8_windows": {width: round(median / medians[REFERENCE], 3) for width, median in medians.items()},
        "nats": nats,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
