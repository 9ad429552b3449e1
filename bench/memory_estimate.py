"""The memory estimate against the measured training peak, for each profile, precision (fp32, bf16) and
activation checkpointing off and on, a few real training steps each at a small batch on CPU.

Each case runs in a fresh process (the trainer, a synthetic stream, no checkpoints) so one case's heap
is not the next one's baseline. The measurement is the trainer's own `training_peak_memory_bytes`:
the resident high-water mark since training started less the resident set before the model was
built (`gptcore.runtime.memory`). Prints one JSON line per case and a closing table: estimate / measured (the
target is within ±25%), and for activation checkpointing the peak's reduction and the step-time cost.

    .venv/bin/python bench/memory_estimate.py [--steps 4]
        [--profiles gpt_first_cpu,gpt_first_cpu_modern,gpt_42m,gpt_100m]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Small batches: a few steps on 2 cores. A modern profile trains with Muon, the optimizer of its recipe.
BATCHES = {"gpt_first_cpu": 4, "gpt_first_cpu_modern": 4, "gpt_42m": 2, "gpt_100m": 1}
TOLERANCE = 0.25


def measure(profile: str, batch: int, precision: str, checkpointing: bool, steps: int) -> dict:
    """One case, in this process: the trainer's summary figures."""
    from gptcore.data.synthetic import synthetic_stream
    from gptcore.runtime.config import RuntimeConfig
    from gptcore.runtime.malloc import tune_malloc
    from gptcore.train.callbacks import TrainingCallback
    from gptcore.train.config import OptimizerConfig, TrainingConfig
    from gptcore.train.job import TrainJob
    from gptcore.train.trainer import train
    from tasks.params.loading import load_profile

    tune_malloc()  # as `gptpipe` runs
    config = load_profile(profile).architecture
    window = config.block_size + 1
    job = TrainJob(
        model=config,
        runtime=RuntimeConfig(
            device="cpu",
            precision=precision,
            batch_size=batch,
            grad_accum_steps=1,
            activation_checkpointing=checkpointing,
        ),
        training=TrainingConfig(
            max_steps=steps,
            log_every=steps,
            eval_every=10_000,
            eval_at_start=False,
            optimizer=OptimizerConfig(name="muon" if config.recipe() else "adamw"),
        ),
        train_tokens=synthetic_stream(config.vocab_size, window * batch * (steps + 1), seed=1),
    )
    summary = train(job, TrainingCallback())
    return {
        "profile": profile,
        "batch_size": batch,
        "precision": precision,
        "activation_checkpointing": checkpointing,
        "estimated_peak_memory_bytes": summary.estimated_peak_memory_bytes,
        "training_peak_memory_bytes": summary.training_peak_memory_bytes,
        "peak_memory_bytes": summary.peak_memory_bytes,
        "steps_per_second": summary.steps_per_second,
    }


def run_case(profile: str, precision: str, checkpointing: bool, steps: int) -> dict:
    arguments = [profile, str(BATCHES[profile]), precision, str(int(checkpointing)), str(steps)]
    done = subprocess.run(
        [sys.executable, __file__, "--case", *arguments],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    lines = [
        "| profile | batch | precision | act. ckpt | estimate MiB | measured MiB | est/meas | step s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        estimate, measured = row["estimated_peak_memory_bytes"], row["training_peak_memory_bytes"]
        lines.append(
            f"| {row['profile']} | {row['batch_size']} | {row['precision']} | "
            f"{'on' if row['activation_checkpointing'] else 'off'} | {estimate / 2**20:.0f} | "
            f"{measured / 2**20:.0f} | {estimate / measured:.2f} | {1 / row['steps_per_second']:.2f} |"
        )
    return "\n".join(lines)


def checkpointing_effect(rows: list[dict]) -> list[str]:
    """Per profile and precision: how much lower the measured peak is with checkpointing, at what cost."""
    lines = []
    for row in rows:
        if not row["activation_checkpointing"]:
            continue
        base = next(
            r
            for r in rows
            if r["profile"] == row["profile"]
            and r["precision"] == row["precision"]
            and not r["activation_checkpointing"]
        )
        saved = 1 - row["training_peak_memory_bytes"] / base["training_peak_memory_bytes"]
        cost = base["steps_per_second"] / row["steps_per_second"] - 1
        lines.append(
            f"{row['profile']} {row['precision']} batch {row['batch_size']}: measured peak {saved:.0%} "
            f"lower with activation checkpointing, step time {cost:+.0%}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--profiles", default=",".join(BATCHES))
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--case", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        profile, batch, precision, checkpointing, steps = args.case
        print(json.dumps(measure(profile, int(batch), precision, checkpointing == "1", int(steps))))
        return
    rows = []
    for profile in args.profiles.split(","):
        for precision in args.precisions.split(","):
            for checkpointing in (False, True):
                row = run_case(profile, precision, checkpointing, args.steps)
                row["ratio"] = round(
                    row["estimated_peak_memory_bytes"] / row["training_peak_memory_bytes"], 3
                )
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(table(rows))
    print("\n".join(checkpointing_effect(rows)))
    outside = [r for r in rows if abs(r["ratio"] - 1) > TOLERANCE]
    print(f"{len(rows) - len(outside)} of {len(rows)} estimates within ±{TOLERANCE:.0%} of the measured peak")


if __name__ == "__main__":
    main()
