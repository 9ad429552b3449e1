"""Data-parallel scaling: tokens/s of `gptpipe train` on 1 and 2 processes, the global batch kept.

CPU: iteration 1's model (`gpt_first_cpu`, 8 x 256 tokens per step) as one process of batch 8 and as two
ranks of batch 4 (Gloo). On a 2-core machine two ranks share the same cores (one thread each instead of
two), so expect well below 2x: the figure is printed as it is. With CUDA: one GPU under torchrun
(`--nproc 1` through `gptcore.distributed.torchrun`, process group and all) against plain single-process
training.

Every figure is the trainer's own steady-state `tokens_per_second` (global, warm-up excluded) from its
summary line, measured in this run. Prints one JSON line per run and the ratios.

    .venv/bin/python bench/scaling.py [--steps 30] [--gpu-steps 50] [--gpu-iteration 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def train(args: list[str], launcher: list[str] | None, checkpoints: Path) -> dict:
    """One `gptpipe train` run in a fresh process; its summary line."""
    entry = launcher or [sys.executable, "-m"]
    command = [*entry, "flows.cli.main", "train", *args, "--checkpoint-directory", str(checkpoints)]
    command += ["--synthetic", "--no-track", "--eval-every", "1000000", "--checkpoint-every", "1000000"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env={**os.environ})
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return next(line for line in lines if line["event"] == "summary")


def report(name: str, summary: dict) -> float:
    figures = {k: summary.get(k) for k in ("tokens_per_second", "steps_per_second", "steps", "mfu")}
    print(json.dumps({"run": name, **figures}), flush=True)
    return float(summary["tokens_per_second"])


def cpu_scaling(steps: int, folder: Path) -> None:
    common = ["--iteration", "1", "--device", "cpu", "--precision", "fp32", "--max-steps", str(steps)]
    common += ["--training-examples", str(8 * (steps + 2))]
    one = report("cpu-1-process-batch-8", train([*common, "--batch-size", "8"], None, folder / "c1"))
    two_args = [*common, "--batch-size", "4", "--nproc", "2"]
    two = report("cpu-2-processes-batch-4", train(two_args, None, folder / "c2"))
    cores = os.cpu_count()
    print(f"cpu: 2 processes / 1 process = {two / one:.2f}x tokens/s ({two:.0f} vs {one:.0f}; {cores} cores)")


def gpu_overhead(steps: int, iteration: int, folder: Path) -> None:
    common = ["--iteration", str(iteration), "--device", "cuda", "--max-steps", str(steps)]
    plain = report("gpu-plain-process", train(common, None, folder / "g1"))
    torchrun = [
        sys.executable,
        "-m",
        "gptcore.distributed.torchrun",
        "--nproc-per-node",
        "1",
        "--standalone",
        "-m",
    ]
    launched = report("gpu-1-rank-under-torchrun", train(common, torchrun, folder / "g2"))
    ratio = launched / plain
    print(f"gpu: 1 rank under torchrun / plain = {ratio:.3f}x tokens/s ({launched:.0f} vs {plain:.0f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--gpu-steps", type=int, default=50)
    parser.add_argument("--gpu-iteration", type=int, default=2)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gptpipe-scaling-") as folder:
        cpu_scaling(options.steps, Path(folder))
        import torch

        if torch.cuda.is_available():
            gpu_overhead(options.gpu_steps, options.gpu_iteration, Path(folder))
        else:
            print("gpu: no CUDA on this machine; the torchrun-vs-plain comparison needs one")


if __name__ == "__main__":
    main()
