"""A quantization trade-off in MLflow: the table on a run (`log_table`), and each quantized model a logged
model of that run and a version of the registered model (`registry.register_quantized`). The quantize
stage records through it (on the tracking writer's thread) and so does `gptpipe quantize`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from gptcore.eval.quant_tradeoff import TradeoffRow
    from tasks.params.schema import TrackingConfig
    from tasks.tracking.models.registry import Registration

TABLE_ARTIFACT = "quantization_tradeoff.json"


def _direct(what: str, function: Callable[..., Any], *args: Any) -> Any:
    return function(*args)


def record_tradeoff(
    client: MlflowClient,
    experiment_id: str,
    run_id: str,
    name: str,
    rows: Sequence[TradeoffRow],
    model_folders: dict[str, str],
    digest: str,
    may_hold_champion: bool,
    call: Callable[..., Any] = _direct,
    split: dict[str, str] | None = None,
) -> dict[str, Registration | None]:
    """Log the rows (the table, fp32 first) on `run_id` and register every measured quantized model
    (its files in `model_folders[method]`) of the checkpoint whose sha256 is `digest` as a version of
    `name`, measured on the test `split` (`test_split.split_tags`); the registration of each method (None
    where `call` got no answer). fp32 is the checkpoint itself, registered by evaluate.

    Each MLflow step goes through `call(what, function, *args)`: the pipeline passes its writer's `ask`,
    so every step is bounded in time and a store that stops answering is noted, not waited for."""
    from gptcore.export.model_files import model_files_in
    from gptcore.model.quantization import REFERENCE
    from gptcore.train.records import table_columns
    from tasks.tracking.models.registry import register_quantized

    table = [row.to_dict() for row in rows]
    call("log_table", client.log_table, run_id, table_columns(table), TABLE_ARTIFACT)
    registrations = {}
    for row in rows:
        if row.measured and row.method != REFERENCE and row.method in model_folders:
            files = model_files_in(Path(model_folders[row.method]))
            arguments = (
                client, experiment_id, run_id, name, files, digest, row.metrics(), may_hold_champion, split
            )  # fmt: skip
            registrations[row.method] = call("register", register_quantized, *arguments)
    return registrations


def register_tradeoff(
    config: TrackingConfig,
    model: str,
    rows: list[TradeoffRow],
    folder: Path,
    may_hold_champion: bool,
    split: dict[str, str],
) -> dict[str, Registration] | None:
    """`gptpipe quantize`'s record: the table on a new run `quantize` beside the run that trained `model`
    (in its experiment), and each measured model (its files in `folder/<method>`) a version of the
    registered model `model` names (`record_tradeoff`). None when `model` is no registered fp32 version
    (a logged model's id, a folder): nothing is recorded."""
    from tasks.tracking.models.model_uri import registered_version
    from tasks.tracking.parent_run import ParentRun
    from tasks.tracking.session import TrackingSession
    from tasks.tracking.store import connect, resolve_target

    target = resolve_target(config)
    client = connect(target)
    source = registered_version(client, model)
    if source is None or "checkpoint_sha256" not in source.tags or not source.run_id:
        return None
    experiment = client.get_experiment(client.get_run(source.run_id).info.experiment_id)
    beside = TrackingSession(target, client, experiment.experiment_id, experiment.name, config.system_metrics)
    run = ParentRun.start(beside, "quantize", {"source_model": model})
    folders = {row.method: str(folder / row.method) for row in rows if row.measured}
    digest = source.tags["checkpoint_sha256"]
    try:
        done = record_tradeoff(
            client, beside.experiment_id, run.run_id, source.name, rows, folders, digest,
            may_hold_champion, split=split,
        )  # fmt: skip
    finally:
        run.finish()
    # Called directly (no writer's bounded `ask`), every registration answers: none is None.
    return {method: found for method, found in done.items() if found is not None}
