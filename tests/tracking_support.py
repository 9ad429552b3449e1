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


def three_step_job(checkpoint_directory: Path, metadata: dict) -> object:
    """A TrainJob of three steps of a one-layer model on a synthetic stream, checkpointing at the end."""
    from gptcore.config import DeviceDefaults, ModelConfig, RuntimeConfig, TrainingConfig
    from gptcore.synthetic import synthetic_stream
    from gptcore.trainer import TrainJob

    return TrainJob(
        model=ModelConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=300),
        runtime=RuntimeConfig(device="cpu", precision="fp32"),
        training=TrainingConfig(max_steps=3, log_every=1, eval_every=3, checkpoint_every=100),
        train_tokens=synthetic_stream(300, 9 * 64, 1),
        validation_tokens=synthetic_stream(300, 9 * 8, 2),
        checkpoint_directory=checkpoint_directory,
        device_defaults=lambda _: DeviceDefaults(batch_size=2),
        metadata=metadata,
    )
