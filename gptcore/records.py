"""The run-record names: which figures of the trainer's records are a run's params and metrics.

One list each, read by every consumer (MLflow tracking, the comparison, the pipeline's stages), so a
figure has one name everywhere.
"""

from __future__ import annotations

import math
from typing import Any

# The training run's params, from the trainer's startup record (plus `effective_batch_size`).
STARTUP_PARAMS = (
    "processor",
    "gpu_name",
    "gpu_memory_bytes",
    "torch_version",
    "cuda_available",
    "device",
    "precision",
    "tensor_cores_enabled",
    "tf32_enabled",
    "fused_adamw",
    "batch_size",
    "grad_accum_steps",
    "workers",
    "sequence_length",
    "parameter_count",
    "max_steps",
    "planned_tokens",
    "planned_steps",
    "epochs",
    "train_examples",
    "validation_examples",
    "flops_per_token",
    "peak_flops",
    "peak_flops_source",
    "fingerprint",
)
STEP_METRICS = ("train_loss", "learning_rate", "grad_norm", "tokens_per_second", "steps_per_second", "mfu")
EVAL_METRICS = ("val_loss", "val_perplexity", "unigram_val_loss")
END_METRICS = (
    "peak_memory_bytes",
    "estimated_peak_memory_bytes",
    "checkpoint_save_seconds",
    "estimated_total_seconds",
    "elapsed_seconds",
    "final_train_loss",
    "final_val_loss",
    "best_val_loss",
)


def startup_params(startup: dict[str, Any]) -> dict[str, Any]:
    """The startup record's params, with the effective batch the optimizer sees."""
    values = {k: startup.get(k) for k in STARTUP_PARAMS if k in startup}
    if "batch_size" in startup and "grad_accum_steps" in startup:
        values["effective_batch_size"] = int(startup["batch_size"]) * int(startup["grad_accum_steps"])
    return values


def profile_params(params: Any) -> dict[str, Any]:
    """The model profile as `model.*` params: its name and architecture."""
    profile = params.model
    values: dict[str, Any] = {"model.profile": profile.name}
    values.update({f"model.{k}": v for k, v in profile.architecture.model_dump().items()})
    return values


def finite_metrics(values: dict[str, Any], names: tuple[str, ...]) -> dict[str, float]:
    """The named entries that are real numbers (None, NaN and infinities are left out)."""
    chosen = {}
    for name in names:
        value = values.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            chosen[name] = float(value)
    return chosen
