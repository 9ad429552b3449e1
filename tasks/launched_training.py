"""Training as torchrun ranks from a pipeline task: `gptpipe train` launched, watched and replayed.

When `runtime.nproc` asks for more than one process, the full-training task cannot train in its own
process: it writes the resolved parameters beside the checkpoints, launches `gptpipe train` under
torchrun through `gptcore.launch`, streams every line into the run's logs, and replays rank 0's JSON
lines into the task's callbacks (Prefect progress, MLflow), as if training ran in process. A failing rank
fails the task with that rank's exit code; a cancelled flow run stops every rank.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml

from gptcore.atomic_write import write_text_atomic
from gptcore.callbacks import CallbackList, TrainingCallback
from gptcore.config import PipelineParams
from gptcore.errors import TrainingError
from tasks.stage_results import TokensResult

LAUNCH_PARAMS = "launch-params.yaml"


def launched_nproc(params: PipelineParams) -> int:
    """Processes per node the parameters ask for (`auto` resolved on this machine)."""
    from gptcore.launch import resolve_nproc

    return resolve_nproc(params.runtime.nproc, params.runtime.device)


def _write_params(params: PipelineParams, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False)
    return write_text_atomic(directory / LAUNCH_PARAMS, text)


def _logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # outside a flow or task run: Prefect raises MissingContextError
        return logging.getLogger("gptpipe.training")


def train_launched(
    params: PipelineParams,
    stage: str,
    tokens: TokensResult,
    directory: Path,
    callbacks: list[TrainingCallback],
    resume: bool,
    nproc: int,
) -> dict[str, Any]:
    """Train `stage` on `nproc` local ranks under torchrun; the summary of rank 0."""
    from gptcore.launch import (
        JsonLinesReplay,
        LaunchSpec,
        launch_environment,
        run_training_subprocess,
        torchrun_command,
    )

    arguments = ["train", "--params", str(_write_params(params, directory)), "--stage", stage, "--no-track"]
    arguments += ["--train-tokens", tokens.train, "--validation-tokens", tokens.validation]
    arguments += ["--tokenizer", tokens.tokenizer_path, "--checkpoint-directory", str(directory)]
    arguments += ["--resume"] if resume else []
    spec = LaunchSpec(nproc_per_node=nproc)
    log = _logger()
    replay = JsonLinesReplay(CallbackList(callbacks), on_text=log.info)

    def on_line(line: str) -> None:
        if line.startswith("{"):
            log.info(line)
        replay(line)

    code = run_training_subprocess(torchrun_command(spec, arguments), on_line, env=launch_environment(spec))
    if code != 0 or replay.summary is None:
        reason = replay.failure or "see the run's logs"
        raise TrainingError(f"{stage} training on {nproc} processes failed with exit code {code}: {reason}")
    return replay.summary
