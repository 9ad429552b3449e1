"""A quantization trade-off in MLflow: the table on a run (`log_table`), and each quantized model a logged
model of that run and a version of the registered model (`registry.register_quantized`). The quantize
stage records through it (on the tracking writer's thread) and so does `gptpipe quantize`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

TABLE_ARTIFACT = "quantization_tradeoff.json"


def _direct(what: str, function: Callable[..., Any], *args: Any) -> Any:
    return function(*args)


def record_tradeoff(
    client: Any,
    experiment_id: str,
    run_id: str,
    name: str,
    rows: list[dict[str, Any]],
    model_folders: dict[str, str],
    digest: str,
    may_hold_champion: bool,
    call: Callable[..., Any] = _direct,
    split: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Log the rows (`TradeoffRow.to_dict()`) on `run_id` and register every measured quantized model
    (its files in `model_folders[method]`) of the checkpoint whose sha256 is `digest` as a version of
    `name`, measured on the test `split` (`test_split.split_tags`); the registration of each method. fp32
    is the checkpoint itself, registered by evaluate.

    Each MLflow step goes through `call(what, function, *args)`: the pipeline passes its writer's `ask`,
    so every step is bounded in time and a store that stops answering is noted, not waited for."""
    from gptcore.eval.quant_tradeoff import TradeoffRow
    from gptcore.export.model_files import model_files_in
    from gptcore.model.quantization import REFERENCE
    from gptcore.train.records import table_columns
    from tasks.tracking.models.registry import register_quantized

    call("log_table", client.log_table, run_id, table_columns(rows), TABLE_ARTIFACT)
    registrations = {}
    for row in (TradeoffRow(**fields) for fields in rows):
        if row.measured and row.method != REFERENCE and row.method in model_folders:
            files = model_files_in(Path(model_folders[row.method]))
            arguments = (
                client, experiment_id, run_id, name, files, digest, row.metrics(), may_hold_champion, split
            )  # fmt: skip
            registrations[row.method] = call("register", register_quantized, *arguments)
    return registrations
