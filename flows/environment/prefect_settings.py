"""Prefect settings from the project's `prefect.toml`, whatever the working directory.

Prefect reads `prefect.toml` only from the working directory. `gptpipe` may run from anywhere, so before
Prefect is imported its settings are exported as `PREFECT_*` environment defaults, with relative paths
anchored at the repository root: results, the temporary server's database and the profiles all stay in
the project's `.prefect/`, and analytics stay off. Variables the user already set win.

The temporary server Prefect starts when no API URL is configured takes seconds; `TemporaryServer`
launches it first so that it comes up while torch and the stage code import.
"""

from __future__ import annotations

import atexit
import base64
import logging
import os
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gptcore.errors import ConfigError
from gptcore.tools.processes import LAUNCHER_PID_VARIABLE

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PREFECT_TOML = PROJECT_ROOT / "prefect.toml"
# Settings whose values are paths, relative to the project root in prefect.toml.
_PATH_SETTINGS = {"PREFECT_HOME", "PREFECT_RESULTS_LOCAL_STORAGE_PATH", "PREFECT_LOCAL_STORAGE_PATH"}


def _flatten(table: dict[str, Any], prefix: str = "PREFECT") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in table.items():
        name = f"{prefix}_{key.upper()}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name))
        elif isinstance(value, bool):
            flat[name] = "true" if value else "false"
        else:
            flat[name] = str(value)
    return flat


def project_settings(toml_path: Path = PREFECT_TOML) -> dict[str, str]:
    """prefect.toml as `PREFECT_*` variables, paths made absolute against the file's folder."""
    if not toml_path.is_file():
        return {}
    settings = _flatten(tomllib.loads(toml_path.read_text(encoding="utf-8")))
    for name in _PATH_SETTINGS & settings.keys():
        path = Path(settings[name]).expanduser()
        settings[name] = str(path if path.is_absolute() else toml_path.parent / path)
    return settings


def apply_project_settings(toml_path: Path = PREFECT_TOML) -> None:
    """Export the project's Prefect settings as defaults; call before importing prefect."""
    for name, value in project_settings(toml_path).items():
        os.environ.setdefault(name, value)
    # prefect.toml turns the server's analytics off; Prefect's client has its own, off by this standard
    # variable alone (else a first run at a terminal prints its telemetry notice).
    os.environ.setdefault("DO_NOT_TRACK", "1")
    home = os.environ.get("PREFECT_HOME")
    if home:
        # Results follow PREFECT_HOME when the user moved it but not the storage path.
        os.environ.setdefault("PREFECT_RESULTS_LOCAL_STORAGE_PATH", str(Path(home) / "storage"))
        Path(home).mkdir(parents=True, exist_ok=True)


class _NoTracebackForUserErrors(logging.Filter):
    """Prefect logs a failed task or flow run with the exception's traceback. For a GptpipeError (a
    failed smoke gate, a missing file) the one-line message is the whole story: keep it, drop the stack."""

    def filter(self, record: logging.LogRecord) -> bool:
        from gptcore.errors import GptpipeError

        if record.exc_info and isinstance(record.exc_info[1], GptpipeError):
            record.exc_info, record.exc_text = None, None
        return True


def hide_user_error_tracebacks() -> None:
    """Install the filter on Prefect's task- and flow-run loggers (idempotent)."""
    for name in ("prefect.task_runs", "prefect.flow_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoTracebackForUserErrors) for f in logger.filters):
            logger.addFilter(_NoTracebackForUserErrors())


class TemporaryServer:
    """Prefect's temporary API server, started as a subprocess before Prefect is even imported.

    Prefect would start the same server itself (`uvicorn prefect.server.api.server:create_app`, here
    run through `flows.environment.prefect_server`, which imports it faster), but only after importing
    its whole server package in this process, and it waits for the server to stop at exit. Starting it
    here first, and pointing PREFECT_API_URL at it, lets it come up while torch and the stage code import;
    at exit it is asked to stop without waiting. The database is the one under PREFECT_HOME, as with
    Prefect's own temporary server.

    The listening socket is made here, on a port the kernel chose, and handed to the server: its address
    is known at once, and the port is never free for another process to take while the server imports
    (Prefect's own picks a port it finds free and starts again on another when the bind is lost).
    """

    def __init__(self, startup_timeout: float = 60.0) -> None:
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.api_url: str | None = None
        self.log: Path | None = None

    def start(self) -> None:
        if os.environ.get("PREFECT_API_URL"):
            return  # a configured server wins
        listener = socket.create_server(("127.0.0.1", 0))  # listening already: early requests queue
        port = listener.getsockname()[1]
        env = {
            **os.environ,
            LAUNCHER_PID_VARIABLE: str(os.getpid()),  # the server stops when this process dies
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
        }
        command = [sys.executable, "-m", "flows.environment.prefect_server", str(listener.fileno())]
        # Its output goes to a log of its own, not the person's terminal: a server stopped mid-request at
        # exit (Ctrl-C, SIGTERM) says so with SQLAlchemy's tracebacks, which are about its teardown alone.
        self.log = Path(os.environ.get("PREFECT_HOME", ".prefect")).expanduser() / "temporary-server.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with listener, self.log.open("ab") as output:  # the server's copy of the socket is its alone
            self.process = subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=output,
                pass_fds=(listener.fileno(),),
            )  # fmt: skip
        atexit.register(self.stop)
        self.api_url = f"http://127.0.0.1:{port}/api"
        os.environ["PREFECT_API_URL"] = self.api_url

    def wait(self) -> None:
        """Block until the server answers its health check; a configured server is checked instead."""
        if self.process is None or self.api_url is None:
            configured = os.environ.get("PREFECT_API_URL")
            if configured:
                check_configured_server(configured)
            return
        deadline = time.monotonic() + self.startup_timeout
        while (left := deadline - time.monotonic()) > 0:
            if self.process.poll() is not None:
                code = self.process.returncode
                raise RuntimeError(
                    f"the temporary Prefect server exited with code {code} (its log: {self.log})"
                )
            try:
                # The socket listens from the start: the request waits in its queue until the server
                # serves it, and fails when the server dies (the socket closes with it); asked again every
                # few seconds all the same, so an exit is seen however the socket fares.
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=min(left, 5)) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        waited = f"{self.startup_timeout:.0f} s"
        raise RuntimeError(
            f"the temporary Prefect server did not answer within {waited} (its log: {self.log})"
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # uvicorn shuts down cleanly on SIGTERM; no need to wait for it
        self.process = None


def check_configured_server(api_url: str) -> None:
    """The server PREFECT_API_URL names answers, and takes PREFECT_API_AUTH_STRING: else one line that
    says which and what to set (Prefect's own client would retry, then print a traceback)."""
    from tasks.tracking.store import redact

    shown = redact(api_url)
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=10):
            pass
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise ConfigError(
            f"PREFECT_API_URL {shown} is unreachable ({getattr(error, 'reason', error)}): start the server "
            "(gptpipe servers), fix PREFECT_API_URL, or unset it to run on a temporary server"
        ) from None
    request = urllib.request.Request(f"{api_url.rstrip('/')}/admin/version")
    auth_string = os.environ.get("PREFECT_API_AUTH_STRING")
    if auth_string:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth_string.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10):
            pass
    except urllib.error.HTTPError as error:
        if error.code != 401:
            return  # answered; whatever else is wrong, Prefect's client says it better
        if auth_string:
            message = f"Prefect server {shown} refused PREFECT_API_AUTH_STRING (not its auth string)"
            raise ConfigError(message) from None
        raise ConfigError(
            f"Prefect server {shown} asks for credentials: set PREFECT_API_AUTH_STRING to its auth string"
        ) from None
