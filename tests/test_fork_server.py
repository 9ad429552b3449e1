"""The suite's forked `gptpipe` (tests/fork_server.py) is the command's own process: it reads the folder
and environment it is given (Prefect's settings too), answers on the streams it is given, passes on a
signal and exits as the command did; its stand-in killed, the command goes too."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil
import yaml
from fault_support import TINY_PARAMS
from process_support import FORKED_GPTPIPE, Lines
from waiting import until


def test_a_forked_command_reads_its_folder_and_its_environment(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text("model: {name: tiny}\n")
    here = subprocess.run(
        [*FORKED_GPTPIPE, "train", "--params", "mine.yaml", "--dry-run"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert here.returncode == 2 and here.stderr.startswith("error: mine.yaml: "), here.stderr
    assert "iteration: missing required key" in here.stderr  # the file in its folder was read
    nobody = "http://127.0.0.1:9/api"  # the discard port: nothing listens there
    away = subprocess.run(
        [*FORKED_GPTPIPE, "run", "--until", "tokenizer"],
        env={**os.environ, "PREFECT_API_URL": nobody}, cwd=tmp_path, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert away.returncode != 0 and nobody in away.stderr, away.stderr  # Prefect's settings are the env's


def training(tmp_path: Path) -> subprocess.Popen[str]:
    """A `gptpipe train` that runs until stopped, once it has said its first step."""
    params = tmp_path / "tiny.yaml"
    long = {**TINY_PARAMS, "full": {**TINY_PARAMS["full"], "max_steps": 10**6, "log_every": 1}}
    params.write_text(yaml.safe_dump(long))
    command = [*FORKED_GPTPIPE, "train", "--params", str(params), "--synthetic", "--device", "cpu"]
    command += ["--checkpoint-directory", str(tmp_path / "checkpoints")]
    return subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def working_in(folder: Path) -> list[psutil.Process]:
    """The live processes whose working folder is `folder` (a fork's environment is not in /proc)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.cwd() == str(folder) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def test_a_signal_reaches_the_command_and_its_stand_in_exits_as_it_did(tmp_path: Path) -> None:
    process = training(tmp_path)
    assert process.stdout is not None
    lines = Lines(process.stdout)
    lines.wait_for(lambda seen: any('"step"' in line for line in seen))
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=120) == 130  # the command's own answer to Ctrl-C
    assert '{"event": "failure", "reason": "KeyboardInterrupt:"}' in lines.text()
    assert working_in(tmp_path) == []


def test_a_stand_in_killed_takes_its_command_along(tmp_path: Path) -> None:
    process = training(tmp_path)
    assert process.stdout is not None
    lines = Lines(process.stdout)
    lines.wait_for(lambda seen: any('"step"' in line for line in seen))
    (command,) = [found for found in working_in(tmp_path) if found.pid != process.pid]
    process.kill()
    process.wait(timeout=60)
    until(lambda: not command.is_running() or command.status() == psutil.STATUS_ZOMBIE, "the command ended")
