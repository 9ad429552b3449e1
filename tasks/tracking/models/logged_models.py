"""Checkpoints as MLflow 3 logged models: the pyfunc of `gpt_pyfunc.py`, linked to the training run and
the step it was saved at, with that step's losses linked to the model, so the runs page's *Models* column
and the model pages work, and `models:/<model_id>` loads it.

Client-only, as everything in this package: no fluent active run (per thread) and no process-wide
tracking URI. The model is built in a scratch folder (weights as safetensors, config, tokenizer, the
pyfunc file and the `gptcore` package) and uploaded with `log_model_artifacts`.
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gptcore
from gptcore.generate import DEFAULT_COMPLETION

if TYPE_CHECKING:
    from gptcore.checkpoint.record import CheckpointRecord
    from gptcore.export.model_files import ModelFiles

PYFUNC = Path(__file__).with_name("gpt_pyfunc.py")  # run by MLflow to load the model, never imported here

EXAMPLE_PROMPTS = ["def main(", "import "]
# Known without a network or an environment scan (which takes seconds in a subprocess).
REQUIREMENTS = ("mlflow", "torch", "tokenizers", "safetensors", "pydantic", "numpy")


def _requirements(quantized: bool = False) -> list[str]:
    from importlib.metadata import version

    names = (*REQUIREMENTS, "torchao") if quantized else REQUIREMENTS
    return [f"{name}=={version(name)}" for name in names]


def _signature() -> Any:
    from mlflow.models import infer_signature

    return infer_signature(EXAMPLE_PROMPTS, ["x", "y"], DEFAULT_COMPLETION)


def save_pyfunc(files: ModelFiles, folder: Path) -> None:
    """The MLflow model of model files saved into `folder`."""
    import mlflow.pyfunc

    from gptcore.model.quantization import TORCHAO_METHODS

    mlflow.pyfunc.save_model(
        str(folder),
        python_model=str(PYFUNC),
        artifacts=files.as_dict(),
        code_paths=[str(Path(gptcore.__file__).parent)],
        signature=_signature(),
        input_example=(EXAMPLE_PROMPTS, DEFAULT_COMPLETION),
        pip_requirements=_requirements(quantized=files.method in TORCHAO_METHODS),
    )


def build_model_folder(checkpoint: Path, folder: Path) -> CheckpointRecord:
    """The MLflow model of `checkpoint` saved into `folder`; returns the checkpoint's record."""
    from gptcore.checkpoint.load import checkpoint_model_files

    files, record = checkpoint_model_files(checkpoint, folder.parent / f"{folder.name}-files")
    save_pyfunc(files, folder)
    return record


def _log_model_folder(
    client: Any, experiment_id: str, run_id: str, folder: Path, name: str, tags: dict
) -> str:
    """A READY logged model of `run_id` holding the MLflow model in `folder`; its model id."""
    logged = client.create_logged_model(experiment_id, name=name, source_run_id=run_id, tags=tags)
    client.log_model_artifacts(logged.model_id, str(folder))
    client.finalize_logged_model(logged.model_id, "READY")
    return logged.model_id


def log_checkpoint_model(
    client: Any, experiment_id: str, run_id: str, checkpoint: Path, kind: str, tags: dict[str, str]
) -> str:
    """Log `checkpoint` (its `kind`: best or final) as a logged model of `run_id`; its model id."""
    from mlflow.entities import LoggedModelOutput, Metric

    from gptcore.tools.fingerprint import sha256_file

    with tempfile.TemporaryDirectory(prefix="gptpipe-model-") as scratch:
        record = build_model_folder(checkpoint, Path(scratch) / "model")  # a bad checkpoint stops here
        model_id = _log_model_folder(
            client,
            experiment_id,
            run_id,
            Path(scratch) / "model",
            f"gpt-{kind}",
            {
                **tags,
                "checkpoint_kind": kind,
                "checkpoint_sha256": sha256_file(checkpoint),
                "checkpoint": str(checkpoint),
            },
        )
    step = int(record.step or 0)
    client.log_outputs(run_id, [LoggedModelOutput(model_id, step=step)])
    stamp = int(time.time() * 1000)
    losses = {"train_loss": record.train_loss, "val_loss": record.val_loss}
    if isinstance(record.val_loss, int | float):
        losses["val_perplexity"] = math.exp(min(record.val_loss, 700.0))
    metrics = [
        Metric(name, float(value), stamp, step, model_id=model_id)
        for name, value in losses.items()
        if isinstance(value, int | float) and math.isfinite(value)
    ]
    if metrics:
        client.log_batch(run_id, metrics=metrics)
    return model_id


def log_files_model(
    client: Any,
    experiment_id: str,
    run_id: str,
    files: ModelFiles,
    name: str,
    tags: dict,
    metrics: dict[str, float],
) -> str:
    """Log model files (a quantized model's) as a logged model of `run_id`, `metrics` linked to it."""
    from mlflow.entities import LoggedModelOutput, Metric

    with tempfile.TemporaryDirectory(prefix="gptpipe-model-") as scratch:
        save_pyfunc(files, Path(scratch) / "model")
        model_id = _log_model_folder(client, experiment_id, run_id, Path(scratch) / "model", name, tags)
    client.log_outputs(run_id, [LoggedModelOutput(model_id, step=0)])
    stamp = int(time.time() * 1000)
    rows = [Metric(key, float(value), stamp, 0, model_id=model_id) for key, value in metrics.items()]
    if rows:
        client.log_batch(run_id, metrics=rows)
    return model_id
