"""Training throughput and MFU of `gpt_first_cpu` at batch 8 x 256 on CPU, fp32 and bf16.

Runs the real trainer (`gptcore.train.trainer.train`) on a synthetic stream for a bounded number of steps and
divides the achieved model FLOP/s by a matmul peak measured in the same process, with the same thread
count, in the same precision. Prints one JSON line per precision and a closing table; no thresholds.

The machine is shared, so one figure measured before the run and one after say little about the
minutes in between. Instead a callback, called after every step (`log_every=1`), times the step from
its own exit to its next entry (so its work stays off the clock) and then probes the matmul peak
right away, under the same load. Figures:

- FLOPs/token: 6*N_matmul + 12*n_layer*n_embd*block_size (PaLM appendix B, as nanoGPT's estimate_mfu;
  N_matmul = the 2-D weights that multiply activations, the tied embedding once).
- peak: the best FLOP/s of a 2048^3 square matmul and of the model's own GEMMs (head, MLP up/down,
  QKV), at the same thread count and precision; the best over every probe of the run.
- mfu: the fastest steady step's model FLOP/s / the best peak: both the least-disturbed sample of
  the same run. Beside it `mfu_paired_median` (median over steady steps of step FLOP/s / the probe
  right after it; under bursty load it can read high, as a short probe may catch a burst the step
  missed) and `mfu_median_vs_best_peak` (median step / best peak, the most conservative).

    .venv/bin/python bench/train_throughput.py [--steps 12] [--threads 2] [--compile]
"""

from __future__ import annotations

# ruff: noqa: E402  (the allocator is tuned before torch and the trainer are imported)
import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from gptcore.runtime.malloc import tune_malloc

# As `gptpipe` does, before torch is imported; GPTPIPE_MALLOC_TUNING=0 measures glibc's defaults.
HOST_ALLOCATOR = tune_malloc()
# The inductor cache lives in the project (git-ignored) so a second --compile run skips codegen.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".cache/inductor"))

import torch

from gptcore.data.synthetic import synthetic_stream
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT
from gptcore.model.size import FLOP_FORMULA, flops_per_token
from gptcore.runtime.config import RuntimeConfig
from gptcore.runtime.flops import SQUARE, Shape, model_matmul_shapes
from gptcore.train.callbacks import TrainingCallback
from gptcore.train.config import OptimizerConfig, TrainingConfig
from gptcore.train.job import TrainJob
from gptcore.train.trainer import train
from tasks.params.loading import load_profile

BATCH = 8
WARMUP_STEPS = 2  # allocator growth, kernel selection, compilation


class MatmulProbe:
    """Best FLOP/s over a fixed set of matmul shapes, operands allocated once."""

    def __init__(self, shapes: tuple[Shape, ...], dtype: torch.dtype) -> None:
        self.operands = [
            (torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)) for m, k, n in shapes
        ]
        self.best_by_shape = {shape: 0.0 for shape in shapes}
        self.shapes = shapes
        self.measure(1)  # first touch and kernel selection, untimed in effect

    def measure(self, repeats: int = 2) -> float:
        """The best FLOP/s of this probe (each shape `repeats` times); also folds into the run's best."""
        best = 0.0
        for shape, (a, b) in zip(self.shapes, self.operands, strict=True):
            for _ in range(repeats):
                start = time.perf_counter()
                torch.mm(a, b)
                rate = 2 * shape[0] * shape[1] * shape[2] / (time.perf_counter() - start)
                best = max(best, rate)
                self.best_by_shape[shape] = max(self.best_by_shape[shape], rate)
        return best


class PairedTiming(TrainingCallback):
    """Step seconds measured between callback calls, each followed by a peak probe."""

    def __init__(self, probe: MatmulProbe) -> None:
        self.probe = probe
        self.started = time.perf_counter()
        self.first_step_seconds: float | None = None
        self.steps: list[tuple[float, float]] = []  # (step seconds, peak FLOP/s right after)
        self.last_exit: float | None = None

    def on_start(self, startup: Any) -> None:
        self.last_exit = time.perf_counter()

    def on_step(self, record: Any) -> None:
        entry = time.perf_counter()
        seconds = entry - self.last_exit
        if self.first_step_seconds is None:
            self.first_step_seconds = seconds
        self.steps.append((seconds, self.probe.measure()))
        self.last_exit = time.perf_counter()


def run(precision: str, steps: int, compile_: bool) -> dict:
    profile = load_profile("gpt_first_cpu")
    arch = profile.architecture
    window = arch.block_size + 1
    tokens = synthetic_stream(arch.vocab_size, window * BATCH * (steps + 1), seed=1)
    job = TrainJob(
        model=arch,
        runtime=RuntimeConfig(
            device="cpu", precision=precision, batch_size=BATCH, grad_accum_steps=1, compile=compile_
        ),
        training=TrainingConfig(
            max_steps=steps,
            log_every=1,
            eval_every=10**9,
            checkpoint_every=10**9,
            optimizer=OptimizerConfig(warmup_steps=2),
        ),
        train_tokens=tokens,
        device_defaults=profile,
    )
    shapes = SQUARE + model_matmul_shapes(arch, BATCH * arch.block_size)
    probe = MatmulProbe(shapes, torch.float32 if precision == "fp32" else torch.bfloat16)
    probe.measure(3)
    timing = PairedTiming(probe)
    summary = train(job, timing)
    probe.measure(3)
    return figures(precision, compile_, arch, summary, timing, probe)


def figures(
    precision: str, compile_: bool, arch: ModelConfig, summary: Any, timing: PairedTiming, probe: MatmulProbe
) -> dict:
    with torch.device("meta"):
        flops = flops_per_token(arch, GPT(arch).matmul_parameter_count())
    step_tokens = BATCH * arch.block_size
    steady = timing.steps[WARMUP_STEPS:] or timing.steps
    peak = max(probe.best_by_shape.values())
    median_seconds = statistics.median(s for s, _ in steady)
    paired = statistics.median(step_tokens / s * flops / p for s, p in steady)
    return {
        "precision": precision,
        "threads": torch.get_num_threads(),
        "compile": compile_,
        "host_allocator": HOST_ALLOCATOR,
        "steps": summary.steps,
        "steady_steps": len(steady),
        "tokens_per_second": round(step_tokens / median_seconds, 1),
        "tokens_per_second_best": round(step_tokens / min(s for s, _ in steady), 1),
        "first_step_seconds": round(timing.first_step_seconds or 0.0, 2),
        "flops_per_token": flops,
        "flop_formula": FLOP_FORMULA,
        "peak_gflops": round(peak / 1e9, 1),
        "peak_source": f"best {precision} torch.mm over square + model GEMMs (m,k,n), every probe of the run",
        "peak_gflops_by_shape": {
            "x".join(map(str, s)): round(r / 1e9, 1) for s, r in probe.best_by_shape.items()
        },
        "model_gflops": round(step_tokens / median_seconds * flops / 1e9, 1),
        "mfu": round(step_tokens / min(s for s, _ in steady) * flops / peak, 3),
        "mfu_paired_median": round(paired, 3),
        "mfu_median_vs_best_peak": round(step_tokens / median_seconds * flops / peak, 3),
        "final_train_loss": summary.final_train_loss,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
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
    print(
        f"MFU = fastest steady step / best matmul peak; paired = median(step / probe after it); "
        f"FLOPs: {FLOP_FORMULA}"
    )
    print(
        f"{'precision':>9} {'tokens/s':>9} {'peak GF/s':>9} {'MFU':>6} {'paired':>6} {'conserv':>7} "
        f"{'target':>6}"
        "  (nanoGPT-like: fp32 0.55, bf16 0.14)"
    )
    for r in results:
        print(
            f"{r['precision']:>9} {r['tokens_per_second']:>9.0f} {r['peak_gflops']:>9.1f} {r['mfu']:>6.3f} "
            f"{r['mfu_paired_median']:>6.3f} {r['mfu_median_vs_best_peak']:>7.3f} "
            f"{targets.get(r['precision'], 0):>6}"
        )


if __name__ == "__main__":
    main()
