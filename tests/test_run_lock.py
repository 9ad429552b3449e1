"""One checkpoint directory, one run: a second holder is refused by name; a dead holder's lock is taken."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gptcore.checkpoint.lock import HOLDER_NAME, RunLock, read_holder
from gptcore.errors import CheckpointError

ROOT = Path(__file__).resolve().parent.parent

# Holds the lock until the test is done with it: until its stdin closes (the test ends it, or dies), not
# for a guessed while that a slow test could outlast.
HOLDER = textwrap.dedent(
    """
    import sys
    from gptcore.checkpoint.lock import RunLock
    lock = RunLock(sys.argv[1]).acquire()
    print("held", flush=True)
    sys.stdin.read()
    """
)


@contextmanager
def holder_of(directory: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding `directory`'s run lock for the block; killed at its end if still alive."""
    command = [sys.executable, "-c", HOLDER, str(directory)]
    process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    with process:  # its pipes closed at the end
        try:
            assert process.stdout is not None and process.stdout.readline().strip() == "held"
            yield process
        finally:
            process.kill()


def test_the_lock_records_pid_host_and_start_time_and_empties_on_release(tmp_path: Path) -> None:
    before = time.time()
    with RunLock(tmp_path / "run") as lock:
        holder = read_holder(tmp_path / "run")
        assert lock.held
        assert holder is not None and holder.pid == os.getpid()
        assert holder.host and holder.started_at
        assert holder.started_unix is not None and before <= holder.started_unix <= time.time()
    assert not lock.held
    assert read_holder(tmp_path / "run") is None
    with RunLock(tmp_path / "run"):  # released means a next run may take it, without a warning
        pass


def test_a_second_run_is_refused_with_the_holders_pid_and_start_time(tmp_path: Path) -> None:
    with holder_of(tmp_path) as holder:
        record = read_holder(tmp_path)
        with pytest.raises(CheckpointError) as refused:
            RunLock(tmp_path).acquire()
        message = str(refused.value)
        assert f"PID {holder.pid}" in message
        assert record is not None and record.started_at in message
        assert "in use by another training run" in message and "\n" not in message


def test_a_lock_left_by_a_killed_process_is_taken_over_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with holder_of(tmp_path) as holder:
        os.kill(holder.pid, signal.SIGKILL)  # no chance to release: the record stays in the file
        holder.wait()
    assert read_holder(tmp_path).pid == holder.pid
    with caplog.at_level(logging.WARNING, logger="gptcore.checkpoint.lock"), RunLock(tmp_path) as lock:
        assert lock.took_over is not None and lock.took_over.pid == holder.pid
        assert read_holder(tmp_path).pid == os.getpid()
    warning = caplog.records[-1].getMessage()
    assert f"taking over the run lock left by PID {holder.pid}" in warning


def test_the_same_directory_cannot_be_locked_twice_even_in_one_process(tmp_path: Path) -> None:
    with RunLock(tmp_path), pytest.raises(CheckpointError, match=f"PID {os.getpid()}"):
        RunLock(tmp_path).acquire()


def test_an_unreadable_record_still_refuses_while_held(tmp_path: Path) -> None:
    with RunLock(tmp_path):
        (tmp_path / HOLDER_NAME).write_text("\x00garbage")
        with pytest.raises(CheckpointError, match="unreadable lock record"):
            RunLock(tmp_path).acquire()


def test_a_directory_that_cannot_be_created_is_a_one_line_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(CheckpointError, match="cannot create the run lock"):
        RunLock(blocker / "run").acquire()


def test_training_holds_the_lock_and_a_second_trainer_on_the_directory_is_refused(tmp_path: Path) -> None:
    from gptcore.data.synthetic import synthetic_stream
    from gptcore.model.config import ModelConfig
    from gptcore.runtime.config import RuntimeConfig
    from gptcore.train.config import TrainingConfig
    from gptcore.train.job import TrainJob
    from gptcore.train.trainer import train

    job = TrainJob(
        model=ModelConfig(n_layer=1, n_head=1, n_embd=16, block_size=8, vocab_size=300),
        runtime=RuntimeConfig(device="cpu", precision="fp32", batch_size=4),
        training=TrainingConfig(max_steps=2, log_every=1, checkpoint_every=1),
        train_tokens=synthetic_stream(300, 9 * 16, seed=1),
        checkpoint_directory=tmp_path,
    )
    with holder_of(tmp_path) as holder:
        with pytest.raises(CheckpointError, match=f"PID {holder.pid}"):
            train(job)
        assert not list(tmp_path.glob("*.pt")), "a refused run wrote nothing"
    train(job)  # the holder is gone (killed): the lock is taken over and released at the end
    assert read_holder(tmp_path) is None
    assert json.loads((tmp_path / "manifest.json").read_text())["checkpoints"]
