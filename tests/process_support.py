"""Processes a test starts and must stop: a loopback port held for a server, a whole process group
brought down, a Prefect home whose database is already migrated, and output lines waited on as they
come."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import IO


@contextmanager
def reserved_port() -> Iterator[int]:
    """A loopback port the kernel chose, held for the test until the block ends, for a server the test
    starts (and may stop and start again) on it.

    The port stays bound here, with SO_REUSEADDR and never listening: a connection to it is refused while
    no server listens, and no other process takes it (Linux gives neither a port-0 bind nor an outgoing
    connection a port bound so; a plain bind of it fails). A server binding it with SO_REUSEADDR, as
    uvicorn (asyncio), PostgreSQL and Prefect's port check do, shares it. A port probed free and closed
    would be anyone's until the server binds it, seconds later on a busy machine."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]


def stop_process_group(process: subprocess.Popen, grace_seconds: float = 30) -> None:
    """SIGTERM to the process's group (it was started with `start_new_session=True`), SIGKILL after the
    grace period."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def built_once(name: str, build: Callable[[Path], None]) -> Path:
    """The file `name` in the temporary folder at the time of asking (in the suite, its run's own:
    tests/conftest.py, shared by its workers), made by `build(path)` the first time: one process builds
    under a file lock while the others wait, and the file appears whole (built aside, then renamed)."""
    from filelock import FileLock

    made = Path(tempfile.gettempdir()) / name
    with FileLock(f"{made}.lock"):
        if not made.is_file():
            building = made.with_name(f"{made.name}.{os.getpid()}.tmp")
            build(building)
            os.replace(building, made)
    return made


def _migrate_prefect_database(database: Path) -> None:
    home = database.with_suffix(".home")
    prefect = Path(sys.executable).parent / "prefect"
    subprocess.run(
        [str(prefect), "server", "database", "upgrade", "-y"],
        env={**os.environ, "PREFECT_HOME": str(home)}, check=True, capture_output=True,
    )  # fmt: skip
    os.replace(home / "prefect.db", database)
    shutil.rmtree(home, ignore_errors=True)


def migrated_prefect_home(home: Path) -> Path:
    """`home` as a PREFECT_HOME whose database is already migrated: a copy of one migrated once per run
    and Prefect version (the migrations take longer than the server's start)."""
    template = built_once(f"gptpipe-test-prefect-{version('prefect')}.db", _migrate_prefect_database)
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, home / "prefect.db")
    return home


class Lines:
    """A process's output lines as they come, read on a thread of their own (so the pipe never fills),
    for a test that acts when something has been said rather than after a guessed while."""

    def __init__(self, stream: IO[str]) -> None:
        self.seen: list[str] = []
        self._said = threading.Condition()
        self._ended = False
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._said:
                self.seen.append(line)
                self._said.notify_all()
        with self._said:
            self._ended = True
            self._said.notify_all()

    def wait_for(self, said: Callable[[list[str]], bool], ceiling: float = 300) -> None:
        """Return once `said(lines so far)` holds; fail when the output ends first or at the ceiling,
        which only ends a hang."""
        with self._said:
            if not self._said.wait_for(lambda: said(self.seen) or self._ended, timeout=ceiling):
                raise AssertionError(f"not said within {ceiling} s: {''.join(self.seen)[-4000:]}")
            assert said(self.seen), f"the output ended first: {''.join(self.seen)[-4000:]}"

    def text(self) -> str:
        """All that was said, once the process has ended."""
        self._thread.join(timeout=60)
        return "".join(self.seen)


# `gptpipe ARGS` started afresh, as a person's is: its imports' warnings on its stderr too, its tree its own.
STARTED_GPTPIPE = [sys.executable, "-m", "flows.cli.main"]
# `gptpipe ARGS` as a process of its own, forked from the suite's fork server (tests/fork_server.py): where
# what is under test is what the command's process does, not how it starts.
FORKED_GPTPIPE = [sys.executable, "-S", str(Path(__file__).with_name("forked_gptpipe.py"))]
FORKED_PREFECT = [*FORKED_GPTPIPE, "-m", "prefect"]  # the `prefect` program (`python -m prefect`), forked


def forked_process_pool(folder: Path) -> Path:
    """A process work pool's base job template (a JSON file in `folder`, for `prefect work-pool create
    --base-job-template`) whose flow runs start forked: its default command is `python -m prefect.engine`
    through the stand-in, where a process worker would start that command afresh."""
    import json

    from prefect.workers.process import ProcessWorker

    template = ProcessWorker.get_default_base_job_template()
    engine = shlex.join([*FORKED_GPTPIPE, "-m", "prefect.engine"])
    template["variables"]["properties"]["command"]["default"] = engine
    path = folder / "forked-process-pool.json"
    path.write_text(json.dumps(template))
    return path


@contextmanager
def fork_server(folder: Path) -> Iterator[None]:
    """The fork server for FORKED_GPTPIPE, found by it through GPTPIPE_FORK_SERVER while the block runs;
    it takes requests at once and answers them once its imports are done. A sweep's or a study's trials
    run forked too (GPTPIPE_TRIAL_PROGRAM, `flows.trials.gptpipe_program`), and so do a training's
    torchrun launcher and ranks (GPTPIPE_PYTHON, `gptcore.distributed.torchrun.python_program`)."""
    if os.environ.get("GPTPIPE_TESTS_FORK") == "0":  # to compare: every forked gptpipe started afresh
        yield
        return
    path = folder / "fork-server.sock"
    log = folder / "fork-server.log"
    with log.open("wb") as errors:
        server = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("fork_server.py")), str(path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors,
        )  # fmt: skip
    assert server.stdout is not None
    try:
        if server.stdout.readline() != b"listening\n":  # bound before its imports: a moment
            raise RuntimeError(f"the fork server did not start: {log.read_text()[-2000:]}")
        os.environ["GPTPIPE_FORK_SERVER"] = str(path)
        os.environ["GPTPIPE_TRIAL_PROGRAM"] = shlex.join(FORKED_GPTPIPE)
        os.environ["GPTPIPE_PYTHON"] = shlex.join(FORKED_GPTPIPE)  # runs `-m MODULE ARGS` as python does
        yield
    finally:
        for variable in ("GPTPIPE_FORK_SERVER", "GPTPIPE_TRIAL_PROGRAM", "GPTPIPE_PYTHON"):
            os.environ.pop(variable, None)
        server.terminate()
        server.wait(timeout=60)


RANK_CEILING = 240  # against a hang only: a collective waits this long for a silent peer


@contextmanager
def rendezvous_store() -> Iterator[dict[str, str]]:
    """A rendezvous (c10d TCPStore) held by the test on a port the kernel chose, and the environment
    that makes every rank a client of it: no port is picked free and handed on, for another process to
    take in between."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    try:
        yield {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(store.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "GPTPIPE_DIST_TIMEOUT": str(RANK_CEILING),
        }
    finally:
        del store


def two_ranks(code: str, cwd: Path) -> tuple[list[int], list[str]]:
    """`python -c code` as ranks 0 and 1 of one process group: their exit codes and printed outputs."""
    with rendezvous_store() as rendezvous:
        processes = []
        for rank in range(2):
            env = {**os.environ, **rendezvous, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
            command = [sys.executable, "-c", code]
            processes.append(subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, text=True))
        outputs = [process.communicate(timeout=RANK_CEILING + 30)[0] for process in processes]
    return [process.returncode for process in processes], outputs
