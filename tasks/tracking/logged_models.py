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
from typing import Any

import gptcore
from gptcore.generate import DEFAULT_COMPLETION

PYFUNC = Path(__file__).with_name("gpt_pyfunc.py")  # run by MLflow to load the model, never imported here

EXAMPLE_PROMPTS = ["def main(", "import "]
# Known without a network or an environment scan (which takes seconds in a subprocess).
REQUIREMENTS = ("mlflow", "torch", "tokenizers", "safetensors", "pydantic", "numpy")


def _requirements() -> list[str]:
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in REQUIREMENTS]


def _signature() -> Any:
    from mlflow.models import infer_signature

    return infer_signature(EXAMPLE_PROMPTS, ["x", "y"], DEFAULT_COMPLETION)


def build_model_folder(checkpoint: Path, folder: Path) -> dict[str, Any]:
    """The MLflow model of `checkpoint` saved into `folder`; returns the checkpoint's record."""
    import mlflow.pyfunc

    from gptcore.generate import load_model
    from gptcore.model_files import checkpoint_tokenizer, write_model_files

    model, record = load_model(checkpoint)
    files = write_model_files(model, checkpoint_tokenizer(record), folder.parent / f"{folder.name}-files")
    mlflow.pyfunc.save_model(
        str(folder),
        python_model=str(PYFUNC),
        artifacts=files.as_dict(),
        code_paths=[str(Path(gptcore.__file__).parent)],
        signature=_signature(),
        input_example=(EXAMPLE_PROMPTS, DEFAULT_COMPLETION),
        pip_requirements=_requirements(),
    )
    return record


def log_checkpoint_model(
    client: Any, experiment_id: str, run_id: str, checkpoint: Path, kind: str, tags: dict[str, str]
) -> str:
    """Log `checkpoint` (its `kind`: best or final) as a logged model of `run_id`; its model id."""
    from mlflow.entities import LoggedModelOutput, Metric

    from gptcore.fingerprint import sha256_file

    with tempfile.TemporaryDirectory(prefix="gptpipe-model-") as scratch:
        record = build_model_folder(checkpoint, Path(scratch) / "model")  # a bad checkpoint stops here
        logged = client.create_logged_model(
            experiment_id,
            name=f"gpt-{kind}",
            source_run_id=run_id,
            tags={
                **tags,
                "checkpoint_kind": kind,
                "checkpoint_sha256": sha256_file(checkpoint),
                "checkpoint": str(checkpoint),
            },
        )
        client.log_model_artifacts(logged.model_id, str(Path(scratch) / "model"))
    client.finalize_logged_model(logged.model_id, "READY")
    step = int(record.get("step", 0))
    client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=step)])
    stamp = int(time.time() * 1000)
    losses = {"train_loss": record.get("train_loss"), "val_loss": record.get("val_loss")}
    if isinstance(losses["val_loss"], int | float):
        losses["val_perplexity"] = math.exp(min(losses["val_loss"], 700.0))
    metrics = [
        Metric(name, float(value), stamp, step, model_id=logged.model_id)
        for name, value in losses.items()
        if isinstance(value, int | float) and math.isfinite(value)
    ]
    if metrics:
        client.log_batch(run_id, metrics=metrics)
    return logged.model_id
