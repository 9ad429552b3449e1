"""Commands that start servers stop their whole process tree on SIGINT and SIGTERM, at any moment,
start-up included, and leave the port free: `gptpipe ui` (an MLflow server and its workers) and
`gptpipe run`'s temporary Prefect server, which goes with `gptpipe run` even when that is killed outright.

No bound here depends on this machine's speed: "stopped" means that when the command has exited, no
process it started is still running (an order of events, checked against every process that carries
the test's mark in its environment, however late it started), within ceilings far above the normal
few seconds."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.process_support import migrated_prefect_home, reserved_port, stop_process_group
from tests.tracking_support import fresh_store
from tests.waiting import answers, until

REPO = Path(__file__).resolve().parent.parent
CEILING = 120.0  # a stop takes a few seconds; a hung one never ends: far above the one, still a bound
MARK = "GPTPIPE_TEST_TREE"  # inherited by every process of the tree, found even after it left the group


@pytest.fixture
def port() -> Iterator[int]:
    """A port held for the test's server (`reserved_port`): nobody else's while the server starts."""
    with reserved_port() as held:
        yield held


def port_free(port: int) -> bool:
    """No server listens on `port` (a port the test holds itself still counts as free)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def alive(tree: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def marked(mark: str) -> list[psutil.Process]:
    """Every running process whose environment carries `mark`: the command's whole tree."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(MARK) == mark and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def start_ui(tmp_path: Path, port: int, mark: str, *options: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    params = tmp_path / "p.yaml"  # a store of its own, not the project's
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    params.write_text(f"iteration: 1\nmodel: gpt_first_cpu\ntracking: {{uri: '{store}'}}\n")
    command = [
        sys.executable,
        "-m",
        "flows.cli.main",
        "ui",
        "--params",
        str(params),
        "--port",
        str(port),
        *options,
    ]
    return subprocess.Popen(
        [*command, *options], cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO), MARK: mark},
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "ui.log").open("w"), start_new_session=True,  # its own group, as in a terminal
        preexec_fn=as_in_a_terminal,
    )  # fmt: skip


def as_in_a_terminal() -> None:
    """Ctrl-C reaches a command typed in a terminal, even where this test runs with SIGINT ignored (a
    background job of a script inherits it ignored, and Python then keeps it so)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def started(mark: str, module: str) -> bool:
    """Whether a process of the tree runs `python -m <module>`."""
    return any(module in p.cmdline() for p in marked(mark))


@pytest.mark.parametrize(
    ("signum", "moment"),
    [
        (signal.SIGTERM, "serving"),
        (signal.SIGINT, "serving"),
        (signal.SIGINT, "mlflow"),  # the server process has just been started: it imports, binds, ...
        (signal.SIGTERM, "mlflow.server.jobs._job_runner"),  # ... and, with --jobs, starts eight more
    ],
    ids=["SIGTERM-serving", "SIGINT-serving", "SIGINT-server-starting", "SIGTERM-workers-starting"],
)
def test_gptpipe_ui_stops_the_server_and_its_workers(
    tmp_path: Path, port: int, signum: int, moment: str
) -> None:
    mark = uuid.uuid4().hex
    process = start_ui(tmp_path, port, mark, *(["--jobs"] if "jobs" in moment else []))
    try:
        if moment == "serving":
            until(lambda: answers(f"http://127.0.0.1:{port}/health"), "the MLflow UI answered", CEILING)
            tree = psutil.Process(process.pid).children(recursive=True)
            assert len(tree) >= 2, "the server and its worker run in processes of their own"
        else:
            until(lambda: started(mark, moment), f"a process of {moment} started", CEILING)
        process.send_signal(signum)  # to `gptpipe ui` alone, not its group: it must stop the tree itself
        process.wait(timeout=CEILING)
        left = [p.cmdline()[:4] for p in marked(mark)]
        assert not left, f"gptpipe ui exited while these still ran: {left}"
        log = (tmp_path / "ui.log").read_text()
        assert "Traceback" not in log, log
        assert process.returncode in (0, 130, -signal.SIGTERM), (process.returncode, log)
        until(lambda: port_free(port), "the port was free again", CEILING)
    finally:
        stop_process_group(process, grace_seconds=5)
        for straggler in marked(mark):
            straggler.kill()


def test_a_killed_gptpipe_run_takes_its_temporary_prefect_server_along(tmp_path: Path) -> None:
    """SIGKILL leaves no handler to run: the server stops itself when its parent dies."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(migrated_prefect_home(tmp_path / "prefect")), PYTHONPATH=str(REPO))
    code = (
        "import time; from flows.environment.prefect_settings import TemporaryServer; "
        "server = TemporaryServer(); "
        "server.start(); server.wait(); print(server.api_url, flush=True); time.sleep(600)"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        api = process.stdout.readline().strip()
        assert api.startswith("http://127.0.0.1:"), api
        port = int(api.split(":")[2].split("/")[0])
        tree = psutil.Process(process.pid).children(recursive=True)
        assert tree and answers(f"{api}/health")
        process.kill()
        process.wait(timeout=5)
        until(lambda: not alive(tree), "the temporary Prefect server stopped", CEILING)
        until(lambda: port_free(port), "the port was free again", CEILING)
    finally:
        stop_process_group(process, grace_seconds=5)


@pytest.mark.slow
def test_gptpipe_run_stopped_by_sigterm_mid_training_leaves_no_process_behind(tmp_path: Path) -> None:
    from tests.test_pipeline import STARTED_GPTPIPE, write_corpus, write_params

    write_corpus(tmp_path)
    params = write_params(tmp_path, full_steps=400, checkpoint_every=20)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}  # its own temporary server
    env.update(
        PREFECT_HOME=str(migrated_prefect_home(tmp_path / "prefect")),
        MLFLOW_TRACKING_URI=fresh_store(tmp_path),
    )
    log = tmp_path / "run.log"  # a file, not a pipe nobody reads while the run fills it
    process = subprocess.Popen(
        [*STARTED_GPTPIPE, "run", "--params", str(params)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
        stderr=log.open("w"), start_new_session=True,
    )  # fmt: skip
    try:
        checkpoints = tmp_path / "checkpoints"
        until(lambda: any(checkpoints.glob("*-full-*/step-*.json")), "full training checkpointed", 240)
        tree = psutil.Process(process.pid).children(recursive=True)
        assert tree, "the temporary Prefect server runs beside it"
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=CEILING)
        until(lambda: not alive(tree), "the temporary Prefect server stopped", CEILING)
        assert process.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM)
        assert "Traceback" not in log.read_text()
        assert (Path(env["PREFECT_HOME"]) / "temporary-server.log").is_file()  # the server's own output
    finally:
        stop_process_group(process, grace_seconds=5)
