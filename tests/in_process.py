"""A `gptpipe` command run inside the test's own process, as a subprocess would run it: the command's
environment for its duration, Prefect's settings read from it, stdout and stderr captured, the exit code
kept. Where no process boundary is under test (a fine-tune's registrations, a pipeline's figures), this
spares the ~5 CPU-seconds a new process spends importing torch, Prefect and MLflow; tests of what a
process does (signals, exits, a cache read by the next process, a terminal) keep their subprocesses."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import chdir, contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """`os.environ` is `env` inside the block (as a child started with `env=` would see it), then what
    it was: whatever the command set (its Prefect defaults, `--json`) leaves with it."""
    before = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


@contextmanager
def prefect_settings_of_environment() -> Iterator[None]:
    """Prefect's settings as a process started now would read them: Prefect reads the environment
    once, when it is imported, and after that only from its settings context."""
    from prefect.context import SettingsContext, get_settings_context
    from prefect.settings import Settings

    with SettingsContext(profile=get_settings_context().profile, settings=Settings()):
        yield


@contextmanager
def log_handlers_into(stream: io.StringIO) -> Iterator[None]:
    """Every logging handler that writes to this process's stderr writes to `stream` inside the block:
    a handler keeps the stream it was made with, which `redirect_stderr` does not reach (a process's
    warnings through `logging` are on its stderr)."""
    stderrs = {id(sys.stderr), id(sys.__stderr__)}
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    handlers = {
        handler
        for logger in loggers
        for handler in getattr(logger, "handlers", [])  # placeholders have none
        if isinstance(handler, logging.StreamHandler)
        and not isinstance(getattr(type(handler), "stream", None), property)  # one that follows sys.stderr
        and id(handler.stream) in stderrs
    }
    kept = [(handler, handler.setStream(stream)) for handler in handlers]
    # A process whose root logger has no handler prints a warning through logging's last resort (its
    # message alone, to stderr); here the root has pytest's capturing handlers, so one stands in for it.
    last_resort = logging.StreamHandler(stream)
    last_resort.setLevel(logging.WARNING)
    root_writes = any(handler in handlers for handler in logging.getLogger().handlers)
    if not root_writes:
        logging.getLogger().addHandler(last_resort)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(last_resort)
        for handler, before in kept:
            handler.setStream(before)


def gptpipe(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`gptpipe ARGS` with `env`, in this process, from the repository's folder; what `subprocess.run(...,
    cwd=REPO, capture_output=True, text=True)` of it would return."""
    from flows.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with (
        environment(env),
        chdir(REPO),
        prefect_settings_of_environment(),
        log_handlers_into(err),
        redirect_stdout(out),
        redirect_stderr(err),
    ):
        code = main(list(args))
    return subprocess.CompletedProcess(["gptpipe", *args], code, out.getvalue(), err.getvalue())
