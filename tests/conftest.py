"""Shared fixtures."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from process_support import fork_server, migrated_prefect_home
from tracking_support import fresh_store

REPO = Path(__file__).resolve().parent.parent
pytest_plugins = ["skip_policy"]  # in CI, a skip that hides a test fails the run (tests/skip_policy.py)


# A test touches only its own folder: whatever a test or the product writes to the home folder (the
# outbox's signing key, Hugging Face's and lm-eval's caches, a browser's profile), the temporary folder
# (pytest's own tmp_path, the migrated Prefect and MLflow templates, torch's compile cache) or the device
# slots' machine-wide locks lands in the run's root, never in the person's home, /tmp or another suite's run.
RootState = tuple[Path, dict[str, str | None], str | None]  # the root; what it replaced
_OWN_ROOT = pytest.StashKey[RootState]()
# Hugging Face's own cache variables, dropped so that they follow HF_HOME (a person's would win over it).
_DERIVED_FROM_HF_HOME = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE",
                         "HF_MODULES_CACHE", "HF_XET_CACHE", "HF_ASSETS_CACHE", "HF_TOKEN_PATH")  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest worker is a machine of its own to the device slots (tasks.device_slot), so a pipeline
    one worker runs never waits for a training another worker's test holds (nor for a person's run
    beside the suite); tests of the slots themselves name their machines.

    The run has a temporary root of its own (`own_root`): made by the controller (or the one process of
    a run without workers) before any worker starts, and inherited by the workers with the environment."""
    worker = getattr(config, "workerinput", {}).get("workerid", "main")  # gw0, gw1...: xdist's workers
    if worker == "main":
        config.stash[_OWN_ROOT] = own_root()
    tempfile.tempdir = os.environ["TMPDIR"]  # a worker's too, whatever tempfile read before
    os.environ["GPTPIPE_MACHINE"] = f"pytest-{worker}"  # set, not defaulted: workers inherit the main's
    # Every process a test starts runs torch on one thread too (`one_thread` below sets it in-process): the
    # workers already share the cores, and a process's second thread on a busy CPU spin-waits for the
    # first. Measured: the scaling study's nine points took 2-4x the CPU time they take alone, and the
    # whole suite 1531 CPU-seconds against 1339 with this.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The controller puts the environment back and removes the run's root, once every worker is done."""
    if _OWN_ROOT not in config.stash:
        return
    root, before, tempdir = config.stash[_OWN_ROOT]
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    tempfile.tempdir = tempdir
    shutil.rmtree(root, ignore_errors=True)


def own_root() -> RootState:
    """A temporary root for the run, with HOME, TMPDIR, the XDG folders, HF_HOME and the machine-wide
    device locks (GPTPIPE_MACHINE_LOCKS) in it; the person's package caches, Python installs and git
    settings stay theirs (a test that installs or asks git finds them: nothing is downloaded again)."""
    real_home = Path.home()
    real_cache = Path(os.environ.get("XDG_CACHE_HOME") or real_home / ".cache")
    real_data = Path(os.environ.get("XDG_DATA_HOME") or real_home / ".local" / "share")
    kept = {
        "PIP_CACHE_DIR": real_cache / "pip",
        "UV_CACHE_DIR": real_cache / "uv",
        "UV_PYTHON_INSTALL_DIR": real_data / "uv" / "python",
        "PYENV_ROOT": real_home / ".pyenv",  # pyenv's shims on PATH find their Pythons through it
        "GIT_CONFIG_GLOBAL": real_home / ".gitconfig",  # safe.directory for a clone another user owns
    }
    root = Path(tempfile.mkdtemp(prefix="gptpipe-tests-"))
    home = root / "home"
    own = {
        "HOME": home,
        "TMPDIR": root / "tmp",
        "XDG_CACHE_HOME": home / ".cache",
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_DATA_HOME": home / ".local" / "share",
        "XDG_STATE_HOME": home / ".local" / "state",
        "HF_HOME": home / ".cache" / "huggingface",
        "GPTPIPE_MACHINE_LOCKS": root / "locks",
    }
    before = {name: os.environ.get(name) for name in [*own, *_DERIVED_FROM_HF_HOME, *kept]}
    for name, folder in own.items():
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.environ[name] = str(folder)
    for name in _DERIVED_FROM_HF_HOME:
        os.environ.pop(name, None)
    for name, path in kept.items():
        if name not in os.environ and path.exists():
            os.environ[name] = str(path)
    return root, before, tempfile.tempdir


# A slow test's seconds when no `seconds` is marked: most take 5-30 on an idle 2-core machine.
SLOW_SECONDS = 10


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules that mostly wait on a clock first (`waits`: a lease running out costs a minute of nobody's
    CPU, so it overlaps the others' work when it starts early, and is all tail when it starts late),
    then the rest by their slow tests' seconds (`@pytest.mark.slow(seconds=N)` where a test takes well
    over SLOW_SECONDS): `make test` hands whole modules to its workers (pytest-xdist, --dist loadfile: a
    module-scoped fixture, a trained model or a server, is built once), and a long module started last
    would run on alone while the other workers idle."""
    seconds: dict[str, float] = {}
    waits: set[str] = set()
    for item in items:
        module = item.module.__name__
        slow = item.get_closest_marker("slow")
        seconds[module] = seconds.get(module, 0) + (slow.kwargs.get("seconds", SLOW_SECONDS) if slow else 0)
        if item.get_closest_marker("waits"):
            waits.add(module)
    items.sort(key=lambda item: (item.module.__name__ not in waits, -seconds[item.module.__name__]))


@pytest.fixture(scope="session", autouse=True)
def forking() -> Iterator[None]:
    """The worker's fork server, for the tests that start `gptpipe` as FORKED_GPTPIPE."""
    with fork_server(Path(tempfile.mkdtemp(prefix="fork-"))):
        yield


# A variable a test leaves behind is read by the next test in its worker. Libraries set some for the process
# once, as they would in a `gptpipe` process (torch's compile cache), and keep private ones of their own
# (`_MLFLOW_TELEMETRY_SESSION_ID`, changed as MLflow likes): new public names are the test's doing when
# they say where things go or who one is (a store, a server, a home).
_PLACES = re.compile(r"MLFLOW_(TRACKING|REGISTRY)_|PREFECT_|GPTPIPE_|HF_HOME|HOME$|TMP|CUDA_|_API_URL|_URI$")


@pytest.fixture(autouse=True)
def environment_left_as_found() -> Iterator[None]:
    """A test, and whatever it ran in this process, leaves the environment as it found it: no variable
    it found is changed or gone, and none that names a place was added (once, a replay's
    MLFLOW_TRACKING_URI stayed, and the next test's `mlflow server` served the replay's store)."""
    before = dict(os.environ)
    yield
    changed = [name for name, value in before.items() if os.environ.get(name) != value]
    changed += [name for name in os.environ.keys() - before.keys() if _PLACES.search(name)]
    changed = [name for name in changed if name != "PYTEST_CURRENT_TEST" and not name.startswith("_")]
    assert not changed, f"the environment was left changed: {sorted(changed)}"


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and a shared, loaded CPU makes two threads crawl."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One Prefect API server for the whole session, started the way `gptpipe run` starts its own
    (`flows.environment.prefect_settings.TemporaryServer`): every module talks to it with a home of its
    own."""
    home = migrated_prefect_home(tmp_path_factory.mktemp("prefect-server"))
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER_SCRIPT], env=env, stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert server.stdout is not None
    url = server.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), url
    yield url
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=20)


@pytest.fixture
def prefect_env(prefect_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a test's `gptpipe` and `prefect` commands: the session's Prefect server, and
    a home, result storage (so caches never cross tests) and MLflow store of the test's own."""
    return commands_env(prefect_server, tmp_path_factory)


def commands_env(prefect_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """`prefect_env`'s environment, for a fixture of a wider scope (a module's shared runs)."""
    home = tmp_path_factory.mktemp("prefect-home")
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_server,
        "PREFECT_HOME": str(home),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(home / "storage"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "MLFLOW_TRACKING_URI": fresh_store(home),
    }
    return env


_SERVER_SCRIPT = """
import signal, sys, threading
from flows.environment.prefect_settings import TemporaryServer
server = TemporaryServer(startup_timeout=300)
server.start()
server.wait()
print(server.api_url, flush=True)
signal.signal(signal.SIGTERM, lambda *_: (server.stop(), sys.exit(0)))
threading.Event().wait()
"""
