"""Training throughput and MFU of `gpt_first_cpu` at batch 8 x 256 on CPU, fp32 and bf16.

Runs the real trainer (`gptcore.trainer.train`) on a synthetic stream for a bounded number of steps and
divides the achieved model FLOP/s by a square-matmul peak measured in the same process, with the same
thread count, in the same precision (best of the measurements before and after the run, since the
machine is shared). Prints one JSON line per precision and a closing table; no thresholds enforced.

    .venv/bin/python bench/train_throughput.py [--steps 20] [--threads 2] [--compile]
"""

from __future__ import annotations

import argparse
import json

import torch

from gptcore.config import OptimizerConfig, RuntimeConfig, TrainingConfig, load_profile
from gptcore.measure import flops_per_token, measured_matmul_peak
from gptcore.model import GPT
from gptcore.synthetic import synthetic_stream
from gptcore.trainer import TrainJob, train


def run(precision: str, steps: int, compile_: bool) -> dict:
    profile = load_profile("gpt_first_cpu")
    arch = profile.architecture
    window = arch.block_size + 1
    tokens = synthetic_stream(arch.vocab_size, window * 8 * (steps + 1), seed=1)
    job = TrainJob(
        model=arch,
        runtime=RuntimeConfig(
            device="cpu", precision=precision, batch_size=8, grad_accum_steps=1, compile=compile_
        ),
        training=TrainingConfig(
            max_steps=steps,
            log_every=steps,
            eval_every=10**9,
            checkpoint_every=10**9,
            optimizer=OptimizerConfig(warmup_steps=2),
        ),
        train_tokens=tokens,
        device_defaults=profile,
    )
    measured_matmul_peak.cache_clear()
    before = measured_matmul_peak("cpu", precision, seconds=1.0)
    summary = train(job)
    measured_matmul_peak.cache_clear()
    after = measured_matmul_peak("cpu", precision, seconds=1.0)
    peak = max(before, after)
    with torch.device("meta"):
        flops = flops_per_token(arch, GPT(arch).matmul_parameter_count())
    return {
        "precision": precision,
        "threads": torch.get_num_threads(),
        "compile": compile_,
        "steps": summary["steps"],
        "tokens_per_second": round(summary["tokens_per_second"], 1),
        "matmul_peak_gflops": round(peak / 1e9, 1),
        "model_gflops": round(summary["tokens_per_second"] * flops / 1e9, 1),
        "mfu": round(summary["tokens_per_second"] * flops / peak, 3),
        "flops_per_token": flops,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--precisions", default="fp32,bf16")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    for precision in args.precisions.split(","):
        results.append(run(precision, args.steps, args.compile))
        print(json.dumps(results[-1]), flush=True)
    targets = {"fp32": 0.70, "bf16": 0.25}
    print(f"{'precision':>9} {'tokens/s':>9} {'MFU':>6} {'target':>6}  (nanoGPT-like: fp32 0.55, bf16 0.14)")
    for r in results:
        print(
            f"{r['precision']:>9} {r['tokens_per_second']:>9.0f} {r['mfu']:>6.3f} "
            f"{targets.get(r['precision'], 0):>6}"
        )


if __name__ == "__main__":
    main()
