"""Prefect settings from the project's `prefect.toml`, whatever the working directory.

Prefect reads `prefect.toml` only from the working directory. `gptpipe` may run from anywhere, so before
Prefect is imported its settings are exported as `PREFECT_*` environment defaults, with relative paths
anchored at the repository root: results, the temporary server's database and the profiles all stay in
the project's `.prefect/`, and analytics stay off. Variables the user already set win.

The temporary server Prefect starts when no API URL is configured takes seconds; `start_temporary_server`
launches it in the background so that it comes up while torch and the stage code import.
"""

from __future__ import annotations

import os
import threading
import tomllib
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
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
    home = os.environ.get("PREFECT_HOME")
    if home:
        # Results follow PREFECT_HOME when the user moved it but not the storage path.
        os.environ.setdefault("PREFECT_RESULTS_LOCAL_STORAGE_PATH", str(Path(home) / "storage"))
        Path(home).mkdir(parents=True, exist_ok=True)


class TemporaryServer:
    """Starts Prefect's temporary server in a background thread when no API URL is configured."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        if os.environ.get("PREFECT_API_URL"):
            return
        self._thread = threading.Thread(target=self._run, name="prefect-temporary-server", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            from prefect.server.api.server import SubprocessASGIServer

            SubprocessASGIServer().start()
        except BaseException as error:  # reported by wait(); Prefect's own start would raise it again
            self._error = error

    def wait(self) -> None:
        """Block until the server answers its health check (Prefect reuses it for the flow run)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
