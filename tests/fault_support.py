"""Fault-injection harness shared by the kill test and `bench/faults.py`.

Runs `gptpipe train` on a tiny CPU fp32 model in subprocesses, `kill -9`s them at seeded random steps
and in the middle of checkpoint writes (the checkpoint module's write-delay hook holds each file open
long enough to be killed inside), resumes each time with `--resume`, and compares the final weights
with an uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
WRITE_DELAY_ENV = "GPTPIPE_FAULT_CHECKPOINT_WRITE_DELAY"
CHECKPOINT_EVERY = 4
MAX_STEPS = 48
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
    """One training process: how it was stopped, where it started and the last step it reported."""

    kind: str  # "step" (killed after a random step), "write" (killed inside a checkpoint write), "finish"
    start_step: int
    last_step: int
    returncode: int
    stderr: str
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


def _environment(write_delay: float | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop(WRITE_DELAY_ENV, None)
    if write_delay:
        env[WRITE_DELAY_ENV] = str(write_delay)
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


def _writing(checkpoints: Path, pid: int) -> bool:
    """Whether process `pid` has a checkpoint file half written (its temporary names carry its PID)."""
    return checkpoints.is_dir() and any(p.name.endswith(f".tmp-{pid}") for p in checkpoints.iterdir())


def run_once(
    params: Path, checkpoints: Path, log: Path, kind: str, target: int | None = None, timeout: float = 60.0
) -> Attempt:
    """Start a run; kill it after step `target` ("step"), inside its next checkpoint write ("write"),
    or let it finish ("finish")."""
    write_delay = 0.5 if kind == "write" else None
    with open(log, "w") as out:
        process = subprocess.Popen(
            train_command(params, checkpoints),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            env=_environment(write_delay),
        )
        deadline = time.monotonic() + timeout
        while process.poll() is None and time.monotonic() < deadline:
            due = (kind == "step" and _last_step(_events(log.read_text())) >= (target or 0)) or (
                kind == "write" and _writing(checkpoints, process.pid)
            )
            if due:
                os.kill(process.pid, signal.SIGKILL)
                break
            time.sleep(0.005)
        if process.poll() is None and time.monotonic() >= deadline:
            process.kill()
        _, stderr = process.communicate()
    events = _events(log.read_text())
    start = next((e["start_step"] for e in events if e.get("event") == "startup"), -1)  # -1: none
    return Attempt(kind, start, _last_step(events), process.returncode, stderr, target)


def final_weights(checkpoints: Path) -> dict[str, Any]:
    import torch

    return torch.load(checkpoints / "final.pt", map_location="cpu", weights_only=True)["model"]


def kill_and_resume(workdir: Path, seed: int = 0, kills: int = 5) -> KillReport:
    """An uninterrupted reference run, then `kills` killed-and-resumed runs and a finishing one."""
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
    # Kinds in a seeded order, at least two of them inside a checkpoint write.
    kinds = ["write", "write"] + ["step"] * (kills - 2)
    rng.shuffle(kinds)
    checkpoints, progress = workdir / "killed", 0
    for index, kind in enumerate(kinds):
        remaining = MAX_STEPS - progress
        target = (
            progress + rng.randint(1, max(1, remaining // (len(kinds) - index + 1)))
            if kind == "step"
            else None
        )
        attempt = run_once(params, checkpoints, workdir / f"kill-{index}.log", kind, target)
        report.attempts.append(attempt)
        progress = attempt.last_step
    report.attempts.append(run_once(params, checkpoints, workdir / "finish.log", "finish"))
    _, stderr = reference.communicate(timeout=120)
    if reference.returncode != 0:
        raise RuntimeError(f"the reference run failed: {stderr.strip()}")
    if report.attempts[-1].returncode == 0:
        ours, theirs = final_weights(checkpoints), final_weights(workdir / "reference")
        report.identical = ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    return report
