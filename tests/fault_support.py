"""Fault-injection harness shared by the kill test and `bench/faults.py`.

Runs `gptpipe train` on a tiny CPU fp32 model in subprocesses, each `kill -9`ed at a placed point: after a
seeded step, or inside the write of the next checkpoint at each of the write's points (its record, its
weights, the manifest complete under their temporary names); resumes each time with `--resume`, and
compares the final weights with an uninterrupted run's. The process kills itself there
(`gptcore/tools/faults.py`): nothing is timed, so a slow machine kills at the same places.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gptcore.tools.faults import KILL_ENV

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT_EVERY = 4
MAX_STEPS = 48
CEILING = 300  # seconds, against a hang only: a run ends in a few
# The points of a checkpoint write a kill is placed at, in the order a write reaches them, and the files
# a kill there leaves under their temporary names (`{name}`: the checkpoint's): the record is written
# while the weights wait, complete, for their rename.
WRITE_POINTS = {
    "checkpoint-record": ("{name}.json", "{name}.pt"),
    "checkpoint-weights": ("{name}.pt",),
    "checkpoint-manifest": ("manifest.json",),
}
TINY_PARAMS: dict[str, Any] = {
    "iteration": 1,
    "model": {
        "name": "tiny",
        "architecture": {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 300},
        "cpu": {"batch_size": 4},
        "gpu": {"batch_size": 4},
    },
    "tokenizer": {"vocab_size": 300},
    # 96 examples of batch 4: 24 steps an epoch, so the 48 steps cross an epoch boundary.
    "full": {"epochs": 2, "training_examples": 96, "validation_examples": 8, "keep_last": 2},
}


@dataclass
class Attempt:
    """One training process: how it was stopped, where it started, the last step it reported and the
    temporary files it left (`.NAME.tmp-PID`: what it was writing when it died)."""

    # "step": killed after step `target`; a WRITE_POINTS key: killed at that point of the write of step
    # `target`'s checkpoint; "finish": run to the end
    kind: str
    start_step: int
    last_step: int
    returncode: int
    stderr: str
    pid: int
    left: list[str] = field(default_factory=list)
    target: int | None = None


@dataclass
class KillReport:
    attempts: list[Attempt] = field(default_factory=list)
    identical: bool = False

    @property
    def kills(self) -> list[Attempt]:
        return [a for a in self.attempts if a.kind != "finish"]

    def work_lost(self) -> list[int]:
        """Steps each kill cost: the last step a killed run reported minus where the next one started."""
        return [
            max(0, killed.last_step - after.start_step)
            for killed, after in zip(self.attempts, self.attempts[1:], strict=False)
            if killed.kind != "finish"
        ]


def write_params(directory: Path) -> Path:
    path = directory / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY_PARAMS))
    return path


def train_command(params: Path, checkpoints: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "flows.cli.main",
        "train",
        "--params",
        str(params),
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--synthetic",
        "--checkpoint-directory",
        str(checkpoints),
        "--resume",
        "--no-track",
        "--max-steps",
        str(MAX_STEPS),
        "--checkpoint-every",
        str(CHECKPOINT_EVERY),
        "--log-every",
        "1",
        "--eval-every",
        "1000",
    ]


def _environment(kill: str | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop(KILL_ENV, None)
    if kill:
        env[KILL_ENV] = kill
    return env


def _events(text: str) -> list[dict[str, Any]]:
    events = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):  # a line cut by the kill
                events.append(json.loads(line))
    return events


def _last_step(events: list[dict[str, Any]]) -> int:
    return max((e["step"] for e in events if e.get("event") == "step"), default=0)


def run_once(params: Path, checkpoints: Path, log: Path, kind: str, target: int | None = None) -> Attempt:
    """Run until the end ("finish"), or until the kill placed at step `target`: after it ("step"), or
    at the point `kind` of its checkpoint's write (a WRITE_POINTS key)."""
    kill = None if kind == "finish" else f"{kind}:{target}"
    with open(log, "w") as out:
        process = subprocess.Popen(
            train_command(params, checkpoints),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            env=_environment(kill),
        )
        try:
            _, stderr = process.communicate(timeout=CEILING)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise RuntimeError(f"gptpipe train ({kind}) hung for {CEILING} s") from None
    events = _events(log.read_text())
    start = next((e["start_step"] for e in events if e.get("event") == "startup"), -1)  # -1: none
    left = sorted(p.name for p in checkpoints.glob(f".*.tmp-{process.pid}"))
    return Attempt(kind, start, _last_step(events), process.returncode, stderr, process.pid, left, target)


def final_weights(checkpoints: Path) -> dict[str, Any]:
    import torch

    return torch.load(checkpoints / "final.pt", map_location="cpu", weights_only=True)["model"]


def kill_and_resume(workdir: Path, seed: int = 0, kills: int = 5) -> KillReport:
    """An uninterrupted reference run, then `kills` killed-and-resumed runs and a finishing one: one
    kill at each point of a checkpoint write (of the first checkpoint after the last step reported), the
    others after a seeded step, in a seeded order."""
    import torch

    rng = random.Random(seed)
    workdir.mkdir(parents=True, exist_ok=True)
    params = write_params(workdir)
    report = KillReport()
    # The uninterrupted reference runs beside the killed ones (it shares nothing with them).
    with open(workdir / "reference.log", "w") as out:
        reference = subprocess.Popen(
            train_command(params, workdir / "reference"),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            env=_environment(None),
        )
    kinds = [*WRITE_POINTS, *["step"] * kills][:kills]
    rng.shuffle(kinds)
    checkpoints, progress = workdir / "killed", 0
    for index, kind in enumerate(kinds):
        remaining = MAX_STEPS - progress  # the next run starts here at most: it reaches the target
        if kind == "step":
            target = progress + rng.randint(1, max(1, remaining // (len(kinds) - index + 1)))
        else:
            target = (progress // CHECKPOINT_EVERY + 1) * CHECKPOINT_EVERY
        if target >= MAX_STEPS:
            raise ValueError(f"{kills} kills do not fit in {MAX_STEPS} steps")
        attempt = run_once(params, checkpoints, workdir / f"kill-{index}.log", kind, target)
        report.attempts.append(attempt)
        progress = attempt.last_step
    report.attempts.append(run_once(params, checkpoints, workdir / "finish.log", "finish"))
    _, stderr = reference.communicate(timeout=CEILING)
    if reference.returncode != 0:
        raise RuntimeError(f"the reference run failed: {stderr.strip()}")
    if report.attempts[-1].returncode == 0:
        ours, theirs = final_weights(checkpoints), final_weights(workdir / "reference")
        report.identical = ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    return report
