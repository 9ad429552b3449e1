"""Fast MLflow stores for tests: the schema migrations (several seconds) run once, then each test copies
the migrated empty database into its own temporary folder."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import mlflow

_TEMPLATE = Path(tempfile.gettempdir()) / f"gptpipe-test-mlflow-{mlflow.__version__}.db"


def _template() -> Path:
    if not _TEMPLATE.is_file():
        from mlflow import MlflowClient

        building = _TEMPLATE.with_name(f"{_TEMPLATE.name}.{os.getpid()}.tmp")
        building.unlink(missing_ok=True)
        MlflowClient(tracking_uri=f"sqlite:///{building}").search_experiments(max_results=1)
        os.replace(building, _TEMPLATE)
    return _TEMPLATE


def fresh_store(folder: Path) -> str:
    """A migrated, empty SQLite store at `folder/mlruns/mlflow.db`; returns its tracking URI."""
    database = folder / "mlruns" / "mlflow.db"
    database.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_template(), database)
    return f"sqlite:///{database}"
