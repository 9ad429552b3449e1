"""The run's checkpoints: when to save, what a checkpoint holds, writing it (rank 0 alone) and
restoring the run from the newest loadable one.

A checkpoint holds every part that decides the run's next step (`TrainingParts`: model, optimizer,
schedule, grad scaler, train state) plus every RNG state, so a resumed run replays the uninterrupted
one; its JSON record carries the run's identity (the trajectory-determining config and its
fingerprint, the model config, the metadata such as the MLflow run id). A resume whose config differs
from the checkpoint's is refused with the differing keys.

The folder is held under its run lock for the whole run, half-written files a killed writer left are
removed first, periodic checkpoints beyond `keep_last` are pruned, and `last_good` names the newest
periodic or final checkpoint written, the one every stop message offers to resume from. Files are
written in the background (`gptcore.checkpoint.writer`): the loop waits for a snapshot only.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from gptcore.checkpoint import files as ckpt
from gptcore.checkpoint.files import State
from gptcore.checkpoint.lock import RunLock
from gptcore.checkpoint.record import CheckpointRecord
from gptcore.checkpoint.writer import CheckpointWriter, Written, snapshot
from gptcore.distributed.group import agree_on_int
from gptcore.errors import CheckpointError
from gptcore.model.config import ModelConfig
from gptcore.tools.fingerprint import code_version
from gptcore.tools.records import Settings

log = logging.getLogger(__name__)


class Stateful(Protocol):
    def state_dict(self) -> State: ...


class Position(Stateful, Protocol):
    """Where a run is (`gptcore.train.state.TrainState`): the step a resume continues from."""

    step: int

    @property
    def epoch(self) -> int: ...

    def load_state_dict(self, state: State) -> None: ...


@dataclass(frozen=True)
class TrainingParts:
    """What a checkpoint holds and a resume restores."""

    model: torch.nn.Module  # the module itself, not its DDP or compiled wrapper
    optimizer: torch.optim.Optimizer
    schedule: Stateful  # the learning-rate schedule (`gptcore.train.schedule.WarmupCosine`)
    scaler: torch.amp.GradScaler
    state: Position


@dataclass(frozen=True)
class RunIdentity:
    """What every checkpoint record of a run carries: the config a resume must match, and more."""

    config: Settings  # the trajectory-determining config (gptcore.train.setup.trajectory_settings)
    fingerprint: str  # the run's (gptcore.train.setup)
    model_config: ModelConfig  # the model's architecture
    metadata: dict[str, str]  # live: the MLflow callback fills in its run id when the run starts
    tokenizer: str | None = None  # the tokenizer's path, when the job names one

    def record_metadata(self) -> dict[str, str]:
        """The metadata as a checkpoint records it now: the run id, when tracked; the tokenizer."""
        metadata = dict(self.metadata)
        if self.tokenizer is not None:
            metadata.setdefault("tokenizer", self.tokenizer)
        return metadata


@dataclass(frozen=True)
class Losses:
    """The losses a checkpoint's record carries: the latest of each, None before the first."""

    train_loss: float | None
    val_loss: float | None


@dataclass(frozen=True)
class CheckpointFigures:
    """What the run's checkpoints cost and left: the summary's figures under their record names."""

    checkpoint_save_seconds: float  # spent writing, in all
    checkpoint_stall_seconds: float  # the training loop's wait: snapshots, and writes before them
    checkpoint_wait_seconds: float  # of the stall, waiting for a write in flight
    checkpoint_saves: int  # checkpoints taken
    final_checkpoint: str | None  # the paths written, None where none was
    best_checkpoint: str | None
    latest_checkpoint: str | None


class Checkpointer:
    def __init__(
        self,
        directory: Path | None,
        every: int,
        keep_last: int,
        writes: bool,
        parts: TrainingParts,
        identity: RunIdentity,
        background: bool = True,
    ) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.every = every
        self.keep_last = keep_last
        self.writes = writes and self.directory is not None  # rank 0 of a real (not dry) run
        self.parts = parts
        self.identity = identity
        self.saved: dict[str, str] = {}  # latest / best / final -> path, once written
        self.seconds = 0.0  # spent writing, in all (on the writer thread when in the background)
        self.stall_seconds = 0.0  # the training loop's wait: the snapshot, and the write before it
        self.wait_seconds = 0.0  # of the stall, waiting for a write in flight (the rest: snapshots)
        self.saves = 0  # checkpoints taken (a snapshot each)
        self.last_good: str | None = None
        self.writer = CheckpointWriter(background)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """The folder, locked against a second run, for the block."""
        if not self.writes:
            yield
            return
        with RunLock(self.directory):
            ckpt.remove_stale_temporaries(self.directory)  # a killed run's half-written files
            try:
                yield
            except BaseException:
                self.writer.close(raise_errors=False)  # the write in flight completes, the lock waits
                raise
            self.writer.close()

    def due(self, step: int, planned_steps: int) -> bool:
        """A periodic checkpoint after this step (the end writes `final` instead)."""
        return step % self.every == 0 and step < planned_steps

    def save(self, kind: str, losses: Losses) -> Path | None:
        """Checkpoint `kind` (step, best or final) of the run as it is now, its record carrying `losses`
        (train_loss, val_loss): a snapshot now, the file written in the background (`finished` reports
        it). Returns the path it will have; None where this process writes none."""
        if not self.writes:
            return None
        started = time.perf_counter()
        self.wait_seconds += self.writer.wait()  # one write in flight at most: one snapshot in memory
        parts, identity, step = self.parts, self.identity, self.parts.state.step
        state = snapshot(
            {
                "model": parts.model.state_dict(),
                "optimizer": parts.optimizer.state_dict(),
                "scheduler": parts.schedule.state_dict(),
                "scaler": parts.scaler.state_dict(),
                **parts.state.state_dict(),
                "rng": ckpt.capture_rng(),
                "fingerprint": identity.fingerprint,
            }
        )
        record = CheckpointRecord(
            kind,
            step,
            parts.state.epoch,
            identity.fingerprint,
            identity.config,
            identity.model_config,
            identity.record_metadata(),
            losses.train_loss,
            losses.val_loss,
            code_version(),
        )
        name = ckpt.step_name(step) if kind == "step" else kind
        keep = self.keep_last if kind == "step" else None
        directory = self.directory

        def write() -> Written:
            path, seconds = ckpt.save_checkpoint(directory, name, state, record, keep)
            return Written(path, kind, step, seconds)

        self.writer.submit(write)
        self.saves += 1
        self.stall_seconds += time.perf_counter() - started
        return directory / f"{name}.pt"

    def settle(self) -> None:
        """On the way out of a failing run: the write in flight completes (its own failure is logged,
        not raised), so the message about what is kept can name it."""
        if self.writes:
            self.writer.close(raise_errors=False)

    def finished(self, wait: bool = False) -> list[Written]:
        """The checkpoints written since the last call (with `wait`, the one in flight too); a failed
        write's error is raised here, on the training thread."""
        if wait and self.writes:
            waited = self.writer.wait()
            self.stall_seconds += waited
            self.wait_seconds += waited
        done = self.writer.finished()
        for written in done:
            self.seconds += written.seconds
            self.saved["latest" if written.kind == "step" else written.kind] = str(written.path)
            if written.kind != "best":
                self.last_good = str(written.path)
        return done

    def figures(self) -> CheckpointFigures:
        """The summary's checkpoint figures: time spent, and the paths written."""
        return CheckpointFigures(
            self.seconds,
            self.stall_seconds,
            self.wait_seconds,
            self.saves,
            self.saved.get("final"),
            self.saved.get("best"),
            self.saved.get("latest"),
        )

    def restore(self, device: str = "cpu") -> Path | None:
        """Load the newest checkpoint that loads into the parts and the RNGs (newer ones that do not are
        skipped with a warning, `checkpoint.resume_from`), every rank agreeing on its step; its path, or
        None (with a warning) when the folder has none yet. A CheckpointError when it was written with a
        different config, or when none loads."""
        path = ckpt.resume_from(self.directory, self._restore_from)
        if path is None:  # the startup line shows start_step 0 and resumed_from null
            log.warning("warning: --resume: no checkpoint in %s yet; starting from step 0", self.directory)
            return None
        self.parts.state.step = agree_on_int(self.parts.state.step, "the resume step", device)
        return path

    def _restore_from(self, path: Path, record: CheckpointRecord, state: State) -> None:
        differences = ckpt.config_differences(record.config or {}, self.identity.config)
        if differences:
            raise CheckpointError(
                f"--resume: {path} was written with a different configuration: " + "; ".join(differences)
            )
        parts = self.parts
        parts.model.load_state_dict(state["model"])
        parts.optimizer.load_state_dict(state["optimizer"])
        if state["scaler"]:
            parts.scaler.load_state_dict(state["scaler"])
        ckpt.restore_rng(state["rng"])
        parts.state.load_state_dict(state)

    def latest(self) -> Path | None:
        return ckpt.latest_checkpoint(self.directory)
