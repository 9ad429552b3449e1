"""How long the training loop waits for a checkpoint: synchronous writes against background ones.

Runs the real trainer on `gptpipe`'s `gpt_42m` profile on CPU (fp32, batch 1, a synthetic stream), a
checkpoint every 2 steps, once with `training.async_checkpoints: false` and once with it on, each in a
fresh process. The stall of a periodic checkpoint is the time its `Checkpointer.save` held the loop
(synchronous: the snapshot and the whole write; background: the snapshot and any wait for the write
before). Also printed: each write's own seconds, and the steady tokens/s (are steps slower while a
write runs beside them?). Target (issue 19): the background stall at most a quarter of the synchronous
write's.

    .venv/bin/python bench/checkpoint_stall.py [--steps 9] [--profile gpt_42m]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def measure(profile: str, steps: int, background: bool) -> dict:
    """One run in this process: the stall of each periodic save and the run's figures."""
    from gptcore.checkpoint.files import manager as checkpointer
    from gptcore.data.synthetic import synthetic_stream
    from gptcore.runtime.config import RuntimeConfig
    from gptcore.runtime.malloc import tune_malloc
    from gptcore.train.callbacks import TrainingCallback
    from gptcore.train.config import TrainingConfig
    from gptcore.train.job import TrainJob
    from gptcore.train.trainer import train
    from tasks.params.loading import load_profile

    tune_malloc()  # as `gptpipe` runs
    stalls: list[tuple[str, float]] = []
    save = checkpointer.Checkpointer.save

    def timed_save(self: checkpointer.Checkpointer, kind: str, losses: dict) -> Path | None:
        started = time.perf_counter()
        path = save(self, kind, losses)
        stalls.append((kind, time.perf_counter() - started))
        return path

    checkpointer.Checkpointer.save = timed_save  # type: ignore[method-assign]
    writes: list[float] = []

    class Writes(TrainingCallback):
        def on_checkpoint(self, path: Path, info: dict) -> None:
            writes.append(info["seconds"])

    config = load_profile(profile).architecture
    with tempfile.TemporaryDirectory(prefix="gptpipe-stall-", dir=REPO) as folder:
        job = TrainJob(
            model=config,
            runtime=RuntimeConfig(device="cpu", precision="fp32", batch_size=1, grad_accum_steps=1),
            training=TrainingConfig(
                max_steps=steps,
                log_every=steps,
                eval_every=10_000,
                checkpoint_every=2,
                keep_last=2,
                async_checkpoints=background,
            ),
            train_tokens=synthetic_stream(config.vocab_size, (config.block_size + 1) * (steps + 1), seed=1),
            checkpoint_directory=Path(folder),
        )
        summary = train(job, Writes())
    periodic = [seconds for kind, seconds in stalls if kind == "step"]
    return {
        "background": background,
        "periodic_stalls": periodic,
        "stall_per_checkpoint": statistics.mean(periodic),
        "write_seconds": statistics.mean(writes),
        "checkpoint_stall_seconds": summary.checkpoint_stall_seconds,
        "tokens_per_second": summary.tokens_per_second,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--profile", default="gpt_42m")
    parser.add_argument("--case", choices=("sync", "background"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(measure(args.profile, args.steps, args.case == "background")))
        return
    rows = {}
    for case in ("sync", "background"):
        command = [
            sys.executable,
            __file__,
            "--case",
            case,
            "--steps",
            str(args.steps),
            "--profile",
            args.profile,
        ]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
        rows[case] = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(rows[case]), flush=True)
    sync, background = rows["sync"], rows["background"]
    ratio = background["stall_per_checkpoint"] / sync["stall_per_checkpoint"]
    print(f"{args.profile} on CPU, stall per periodic checkpoint:")
    for name, row in (("synchronous", sync), ("background", background)):
        print(
            f"  {name:12} {row['stall_per_checkpoint']:.3f} s (its writes {row['write_seconds']:.3f} s), "
            f"{row['tokens_per_second']:.0f} tokens/s"
        )
    print(f"  background / synchronous stall: {ratio:.2f} (target at most 0.25)")


if __name__ == "__main__":
    main()
