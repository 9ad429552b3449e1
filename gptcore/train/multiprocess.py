"""Training on several processes: the launching side (`launch_job`) and one rank (`python -m
gptcore.train.multiprocess
JOB.json`, which torchrun starts once per process).

The launcher saves the `TrainJob` as JSON, starts torchrun over this module and reads rank 0's JSON
lines back into its own callbacks (`gptcore.train.json_lines.JsonLinesReplay`): the person's JSON lines, the
MLflow run and the pipeline's progress all live in the launching process, the ranks only train. The CLI
(`gptpipe train --nproc N`) and the pipeline's full stage call `launch_job` alike.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from gptcore.data.tokenfile import TokenStream, open_tokens
from gptcore.errors import GptpipeError
from gptcore.finetune.config import adapter_settings
from gptcore.model.config import ModelConfig
from gptcore.runtime.batch_size import BatchChoice
from gptcore.runtime.config import DeviceDefaults, RuntimeConfig
from gptcore.runtime.decided import Runtime
from gptcore.tools.records import JSONObject
from gptcore.train.callbacks import CallbackList, TrainingCallback
from gptcore.train.config import TrainingConfig
from gptcore.train.job import TrainJob
from gptcore.train.records import SummaryRecord

RANK_MODULE = "gptcore.train.multiprocess"  # this module: torchrun runs it once per rank


def _section(value: TrainingConfig | None) -> JSONObject | None:
    return TrainingConfig.of(value).model_dump(mode="json") if value is not None else None


def _load_section(data: JSONObject | None) -> TrainingConfig | None:
    return TrainingConfig.model_validate_json(json.dumps(data)) if data is not None else None


def _source(source: Path | TokenStream | None, folder: Path, name: str) -> dict[str, str] | None:
    """A token source as a file every rank opens: an in-memory stream (synthetic) is written beside the
    job, under the name it had, so a run's identity (and its checkpoints' config) does not change."""
    if source is None:
        return None
    if isinstance(source, TokenStream) and not Path(source.path).is_file():
        path = folder / f"{name}.bin"
        np.asarray(source.tokens).astype(np.uint16).tofile(path)
        return {"file": str(path), "name": str(source.path)}
    return {"file": str(source.path if isinstance(source, TokenStream) else source)}


def _load_source(data: dict[str, str] | None) -> Path | TokenStream | None:
    if data is None:
        return None
    if "name" not in data:
        return Path(data["file"])
    return TokenStream(Path(data["name"]), open_tokens(data["file"]).tokens, None)


def save_job(job: TrainJob, folder: Path) -> Path:
    """`folder/job.json`, and the token files of in-memory streams: what a rank rebuilds the job from."""
    folder.mkdir(parents=True, exist_ok=True)
    defaults = job.defaults()
    data = {
        "model": job.model.model_dump(mode="json"),
        "runtime": job.runtime.model_dump(mode="json"),
        "training": _section(job.training),
        "follows": _section(job.follows),
        "follows_world_size": job.follows_world_size,
        "batch": asdict(job.batch) if job.batch else None,
        "decided": job.decided.to_dict() if job.decided else None,
        "train_tokens": _source(job.train_tokens, folder, "train"),
        "validation_tokens": _source(job.validation_tokens, folder, "validation"),
        "checkpoint_directory": str(job.checkpoint_directory) if job.checkpoint_directory else None,
        "resume": job.resume,
        "dry_run": job.dry_run,
        "device_defaults": {device: defaults(device).model_dump(mode="json") for device in ("cpu", "cuda")},
        "tokenizer": str(job.tokenizer) if job.tokenizer else None,
        "extra_fingerprint": job.extra_fingerprint,
        "metadata": job.metadata,
        # A fine-tune's start: every rank loads the same weights and puts the same adapters on them.
        "init_weights": str(job.init_weights) if job.init_weights else None,
        "lora": job.lora.model_dump(mode="json") if job.lora else None,
    }
    path = folder / "job.json"
    path.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    return path


def read_job(path: Path) -> JSONObject:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def load_job(data: JSONObject, world_size: int, rank: int) -> TrainJob:
    """The saved job (`read_job`) as this rank's."""
    defaults = {
        device: DeviceDefaults.model_validate_json(json.dumps(value))
        for device, value in data["device_defaults"].items()
    }
    directory = data["checkpoint_directory"]
    return TrainJob(
        model=ModelConfig.model_validate_json(json.dumps(data["model"])),
        runtime=RuntimeConfig.model_validate_json(json.dumps(data["runtime"])),
        training=_load_section(data["training"]),
        follows=_load_section(data["follows"]),
        follows_world_size=data["follows_world_size"],
        batch=BatchChoice(**data["batch"]) if data.get("batch") else None,
        decided=Runtime(**data["decided"]) if data.get("decided") else None,  # as to_dict wrote it
        train_tokens=_load_source(data["train_tokens"]),
        validation_tokens=_load_source(data["validation_tokens"]),
        checkpoint_directory=Path(directory) if directory else None,
        resume=data["resume"],
        dry_run=data["dry_run"],
        device_defaults=defaults.__getitem__,
        tokenizer=Path(data["tokenizer"]) if data["tokenizer"] else None,
        extra_fingerprint=data["extra_fingerprint"],
        metadata=data["metadata"],
        init_weights=Path(data["init_weights"]) if data.get("init_weights") else None,
        lora=adapter_settings(data["lora"]) if data.get("lora") else None,
        world_size=world_size,
        rank=rank,
    )


def launch_job(
    job: TrainJob, spec: Any, callbacks: list[TrainingCallback], on_text: Any = None
) -> tuple[int, SummaryRecord | None, str | None]:
    """Run `job` on `spec`'s processes under torchrun; rank 0's events reach `callbacks` as they come, and
    a launch that ends without rank 0 saying why (a rank killed) reaches their `on_failure` too.
    Returns (exit code, the summary record or None, the failure reason or None)."""
    import tempfile

    from gptcore.distributed.torchrun import launch_environment, torchrun_command
    from gptcore.tools.processes import run_process_tree
    from gptcore.train.json_lines import JsonLinesReplay

    events = CallbackList(callbacks)
    replay = JsonLinesReplay(events, on_text=on_text)
    with tempfile.TemporaryDirectory(prefix="gptpipe-job-") as folder:
        command = torchrun_command(spec, RANK_MODULE, [str(save_job(job, Path(folder)))])
        code = run_process_tree(command, replay, env=launch_environment(spec))
    if code != 0 and replay.failure is None:
        replay.failure = f"training on several processes failed with exit code {code}"
        events.on_failure(replay.failure)
    return code, replay.summary, replay.failure


def main(argv: list[str]) -> int:
    """One rank: join the group, rebuild the job, train; rank 0 prints its events as JSON lines."""
    from gptcore.distributed.group import leave_rank, process_group
    from gptcore.runtime.device import resolve_device
    from gptcore.train.json_lines import JsonLinesCallback
    from gptcore.train.trainer import train

    code = 0
    try:
        data = read_job(Path(argv[0]))
        with process_group(resolve_device(data["runtime"]["device"])) as world:
            job = load_job(data, world.world_size, world.rank)
            train(job, JsonLinesCallback() if world.is_main else TrainingCallback())
    except GptpipeError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        code = error.exit_code
    except KeyboardInterrupt:
        code = 130
    leave_rank(code)  # see gptcore.distributed.group.leave_rank: no interpreter finalization under Gloo
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
