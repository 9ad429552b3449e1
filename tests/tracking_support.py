"""Fast MLflow stores for tests: the schema migrations (several seconds) run once, then each test copies
the migrated empty database into its own temporary folder."""

from __future__ import annotations

import shutil
import threading
from importlib.metadata import version
from pathlib import Path
from typing import Any

from process_support import built_once


def _migrate_mlflow_store(database: Path) -> None:
    from mlflow import MlflowClient

    database.unlink(missing_ok=True)
    MlflowClient(tracking_uri=f"sqlite:///{database}").search_experiments(max_results=1)


def _template() -> Path:
    """The migrated empty store, built once per run (`process_support.built_once`)."""
    return built_once(f"gptpipe-test-mlflow-{version('mlflow')}.db", _migrate_mlflow_store)


def fresh_store(folder: Path) -> str:
    """A migrated, empty SQLite store at `folder/mlruns/mlflow.db`; returns its tracking URI."""
    database = folder / "mlruns" / "mlflow.db"
    database.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_template(), database)
    return f"sqlite:///{database}"


def three_step_job(checkpoint_directory: Path, metadata: dict) -> object:
    """A TrainJob of three steps of a one-layer model on a synthetic stream, checkpointing at the end."""
    from gptcore.data.synthetic import synthetic_stream
    from gptcore.model.config import ModelConfig
    from gptcore.runtime.config import DeviceDefaults, RuntimeConfig
    from gptcore.train.config import TrainingConfig
    from gptcore.train.job import TrainJob

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


def tracked_training(folder: Path, experiment: str = "models") -> tuple[object, object, Path]:
    """A tracked 8-step training on real text (two standard-library packages) with a trained tokenizer,
    declaring its token files as datasets: its TrackingSession, MLflowCallback and checkpoint folder."""
    import sysconfig

    from gptcore.data.build import build_token_files
    from gptcore.data.config import CorpusConfig, TokenizerConfig
    from gptcore.data.corpus import open_corpus
    from gptcore.data.tokenizer import train_tokenizer
    from gptcore.model.config import ModelConfig
    from gptcore.runtime.config import RuntimeConfig
    from gptcore.train.config import OptimizerConfig, TrainingConfig
    from gptcore.train.job import TrainJob
    from gptcore.train.trainer import train
    from tasks.params.schema import TrackingConfig
    from tasks.tracking import DeliverySettings, TrackingSession, training_metadata

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = [str(stdlib / "json" / "*.py"), str(stdlib / "email" / "*.py")]
    corpus = open_corpus(
        CorpusConfig(source="local", paths=paths, validation_fraction=0.2, test_fraction=0.2)
    )
    tokenizer = train_tokenizer(corpus, TokenizerConfig(vocab_size=400), folder)
    tokens = build_token_files(corpus, tokenizer, folder)
    store = TrackingConfig(uri=fresh_store(folder), artifact_root=str(folder / "art"), experiment=experiment)
    session = TrackingSession.open(store)
    datasets = {"train": tokens.train.path, "validation": tokens.validation.path}
    callback = session.training_callback(
        "train", system_metrics=False, delivery=DeliverySettings(flush_seconds=0.05), datasets=datasets
    )
    train(
        TrainJob(
            model=ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=400),
            runtime=RuntimeConfig(device="cpu", precision="fp32", batch_size=4),
            training=TrainingConfig(
                max_steps=8,
                log_every=4,
                eval_every=4,
                checkpoint_every=4,
                optimizer=OptimizerConfig(warmup_steps=1),
            ),
            train_tokens=Path(tokens.train.path),
            validation_tokens=Path(tokens.validation.path),
            checkpoint_directory=folder / "run",
            tokenizer=Path(tokenizer.path),
            metadata=training_metadata([callback]),
        ),
        callback,
    )
    return session, callback, folder / "run"


class Waits:
    """Each time a caller of a RunWriter waited for an answer the writer's thread had not given yet: the
    caller's thread, the record's op and `when()` at that moment (say, whether the server was away). A
    count of waits, not a measure of time: what "never waits on the store" means whatever this machine's
    speed (a wait that ran out its bound says so in the report's `last_error`: "did not answer within")."""

    def __init__(self, monkeypatch: Any, when: Any = lambda: None) -> None:
        from tasks.tracking.delivery.writer import RunWriter

        self.waited: list[tuple[str, str, Any]] = []
        original = RunWriter._await

        def watched(writer: Any, item: Any) -> Any:
            if item is not None and item.answer is not None and not item.answer.done():
                self.waited.append((threading.current_thread().name, item.op, when()))
            return original(writer, item)

        monkeypatch.setattr(RunWriter, "_await", watched)

    def on(self, thread: str, when: Any = None) -> list[str]:
        return [op for name, op, at in self.waited if name == thread and (when is None or at == when)]
