"""`gptpipe device`, `gptpipe train`, `gptpipe generate`: the training engine from the command line.

Flags map onto parameter-file keys (`--batch-size` is `runtime.batch_size`, `--max-steps` is
`<stage>.max_steps`), applied like `--set` overrides so one validation covers both. Torch is imported
inside the commands only. Progress comes out as JSON lines on stdout (see `gptcore.train.json_lines`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import typer
from pydantic import JsonValue

from flows.cli.options import batch_size_value, command_of, json_lines_only, nproc_value, resolve_params
from gptcore.errors import ConfigError
from gptcore.runtime.config import Device, Precision
from gptcore.train.callbacks import TrainingCallback
from gptcore.train.records import StartupRecord
from tasks.params.loading import choice
from tasks.params.schema import PipelineParams, TrainingStage

if TYPE_CHECKING:
    from gptcore.data.tokenfile import TokenStream


class JobFields(TypedDict):
    """What `gptpipe train` gives `launch_training` beside the parameter file (`TrainJob`'s fields): token
    sources are files, synthetic streams (`--synthetic`) or none (`--dry-run`)."""

    train_tokens: Path | TokenStream | None
    validation_tokens: Path | TokenStream | None
    checkpoint_directory: Path
    resume: bool
    dry_run: bool
    tokenizer: Path | None


def device_command(
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or mps"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object instead of a table"),
) -> None:
    """Verify the environment: torch, CUDA, the device a run takes, bf16, TF32, fused AdamW."""
    from gptcore.runtime.device import device_report

    report = device_report(choice("--device", device, Device)).to_dict()
    if as_json:
        print(json.dumps(report))
        return
    for key, value in report.items():
        print(f"{key:24} {value}")


def parameter_overrides(stage: str, flags: dict[str, JsonValue]) -> list[str]:
    """Command-line flags as `key.path=value` overrides of the parameter file."""
    runtime_keys = {
        "device": "device",
        "precision": "precision",
        "batch_size": "batch_size",
        "grad_accum": "grad_accum_steps",
        "effective_batch_size": "effective_batch_size",
        "activation_checkpointing": "activation_checkpointing",
        "workers": "workers",
        "compile": "compile",
        "nproc": "nproc",
    }
    overrides = []
    for flag, value in flags.items():
        if value is None or (value is False and flag != "compile"):  # --no-compile is a choice, not absence
            continue
        section = f"runtime.{runtime_keys[flag]}" if flag in runtime_keys else f"{stage}.{flag}"
        overrides.append(f"{section}={json.dumps(value)}")
    return overrides


def training_callbacks(
    params: PipelineParams,
    stage: str,
    track: bool = False,
    params_file: Path | None = None,
    job_fields: JobFields | None = None,
) -> list[TrainingCallback]:
    """The callbacks `gptpipe train` runs with: JSON lines (a progress bar and the summary line alone for a
    person at a terminal: `gptpipe.progress_bar`), and with `track` the MLflow run (the store is
    checked here, so an unreachable tracking server stops the command before any training), which
    declares the job's token files as its datasets."""
    from gptcore.train.json_lines import JsonLinesCallback
    from tasks.progress_bar import ProgressBar, wants_progress_bar

    callbacks: list[TrainingCallback] = (
        [ProgressBar(stage), JsonLinesCallback(events=("summary", "failure"))]
        if wants_progress_bar()
        else [JsonLinesCallback()]
    )
    callbacks.append(WarningLines())
    if track:
        from tasks.tracking import TrackingSession
        from tasks.tracking.session import run_label

        session = TrackingSession.open(params.tracking)
        tags = {"stage": stage, "kind": "training", "source": "gptpipe train"}
        inputs = [params_file] if params_file else []
        run_name = f"{stage}-{run_label(params, params_file)}"
        train, validation = (
            (job_fields["train_tokens"], job_fields["validation_tokens"]) if job_fields else (None, None)
        )
        datasets = {"train": train, "validation": validation}
        callback = session.training_callback(
            run_name,
            tags=tags,
            params=params.model.as_params() | params.optimizer_params(stage),
            artifacts=inputs,
            datasets=datasets,
        )
        callbacks.append(callback)
    return callbacks


class WarningLines(TrainingCallback):
    """What the start-up record warns of (a precision slower than fp32 here) as one line on stderr."""

    def on_start(self, startup: StartupRecord) -> None:
        if startup.precision_warning:
            print(f"warning: {startup.precision_warning}", file=sys.stderr, flush=True)


def _token_sources(
    params: PipelineParams,
    stage: str,
    train_tokens: Path | None,
    validation_tokens: Path | None,
    synthetic: bool,
) -> tuple[Path | TokenStream | None, Path | TokenStream | None]:
    if train_tokens is not None or not synthetic:
        return train_tokens, validation_tokens
    from gptcore.data.synthetic import synthetic_stream

    section = getattr(params, stage)
    window = params.model.architecture.block_size + 1
    vocab = params.tokenizer.vocab_size
    train = synthetic_stream(vocab, window * (section.training_examples or 2048), seed=1)
    validation = synthetic_stream(
        vocab, window * (section.validation_examples or 64), seed=2, split="validation"
    )
    return train, validation_tokens or validation


def preflight_inputs(
    params: PipelineParams, train_tokens: Path | None, validation_tokens: Path | None, tokenizer: Path | None
) -> None:
    """Token files and tokenizer checked before the trainer loads, so a bad one is answered in a
    moment: size and dtype against the manifest, ids and tokenizer against the model's vocabulary."""
    from gptcore.data.tokenfile import check_tokenizer, check_vocabulary, open_tokens

    vocab = params.model_profile().architecture.vocab_size
    streams = []
    for path in (train_tokens, validation_tokens):
        if path is None:
            continue
        stream = open_tokens(path)
        check_vocabulary(stream, vocab)
        streams.append(stream)
    if tokenizer is not None:
        check_tokenizer(tokenizer, vocab, tuple(streams))


# The flags that override a parameter-file key as they are (`parameter_overrides` maps each to its key).
OVERRIDE_FLAGS = (
    "device", "precision", "grad_accum", "effective_batch_size", "activation_checkpointing", "workers",
    "epochs", "max_steps", "training_examples", "validation_examples", "log_every", "eval_every",
    "checkpoint_every",
)  # fmt: skip


@dataclass
class TrainOptions:
    """`gptpipe train`'s flags, one field each (`command_of` makes the command of them)."""

    iteration: int | None = typer.Option(None, "--iteration", min=1, help="params/iteration_N.yaml")
    params_file: Path | None = typer.Option(None, "--params", help="a parameter file")
    set_: list[str] = typer.Option([], "--set", help="override a parameter: key.path=value (repeatable)")
    stage: str = typer.Option("full", "--stage", help="which training section: smoke or full")
    device: str | None = typer.Option(None, "--device", help="auto, cpu, cuda or mps")
    precision: str | None = typer.Option(None, "--precision", help="auto, fp32, bf16 or fp16")
    batch_size: str | None = typer.Option(
        None, "--batch-size", help="per micro-step, or auto: the largest that fits (probed on CUDA)"
    )
    grad_accum: int | None = typer.Option(None, "--grad-accum", min=1)
    effective_batch_size: int | None = typer.Option(
        None, "--effective-batch-size", min=1, help="samples per optimizer step: sets --grad-accum"
    )
    activation_checkpointing: bool = typer.Option(
        False, "--activation-checkpointing", help="recompute each block in the backward pass: less memory"
    )
    epochs: int | None = typer.Option(None, "--epochs", min=1)
    max_steps: int | None = typer.Option(None, "--max-steps", min=1)
    training_examples: int | None = typer.Option(None, "--training-examples", min=1)
    validation_examples: int | None = typer.Option(None, "--validation-examples", min=1)
    workers: int | None = typer.Option(None, "--workers", min=0)
    log_every: int | None = typer.Option(None, "--log-every", min=1)
    eval_every: int | None = typer.Option(None, "--eval-every", min=1)
    checkpoint_every: int | None = typer.Option(None, "--checkpoint-every", min=1)
    train_tokens: Path | None = typer.Option(None, "--train-tokens", help="token file (.bin, .pt, project)")
    validation_tokens: Path | None = typer.Option(None, "--validation-tokens")
    tokenizer: Path | None = typer.Option(None, "--tokenizer", help="tokenizer.json, recorded for generate")
    checkpoint_directory: Path | None = typer.Option(None, "--checkpoint-directory")
    resume: bool = typer.Option(False, "--resume", help="continue from the directory's latest checkpoint")
    dry_run: bool = typer.Option(False, "--dry-run", help="resolve, build, estimate; train and write nothing")
    synthetic: bool = typer.Option(False, "--synthetic", help="train on a synthetic learnable stream")
    compile_: bool | None = typer.Option(
        None, "--compile/--no-compile", help="torch.compile the model (default: runtime.compile, auto)"
    )
    no_track: bool = typer.Option(False, "--no-track", help="do not record the run in MLflow")
    nproc: str | None = typer.Option(None, "--nproc", help="processes per node: N or auto (one per GPU)")
    nnodes: int | None = typer.Option(None, "--nnodes", min=1, help="machines in the job (torchrun)")
    node_rank: int | None = typer.Option(None, "--node-rank", min=0, help="this machine's index")
    rdzv_endpoint: str | None = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT every node reaches")
    rdzv_backend: str | None = typer.Option(None, "--rdzv-backend", help="c10d (default) or static")
    rdzv_id: str | None = typer.Option(None, "--rdzv-id", help="job id shared by the nodes")
    json_only: bool = typer.Option(False, "--json", help="JSON lines only, also on a terminal")


@command_of(TrainOptions)
def train_command(o: TrainOptions) -> None:
    """Train a model from an iteration's parameters; JSON lines on stdout, a summary line last (on a
    terminal: a progress bar and the summary line)."""
    json_lines_only(o.json_only)
    choice("--stage", o.stage, TrainingStage)
    for flag, value, allowed in (("--device", o.device, Device), ("--precision", o.precision, Precision)):
        if value is not None:
            choice(flag, value, allowed)
    flags = {name: getattr(o, name) for name in OVERRIDE_FLAGS}
    flags.update(batch_size=batch_size_value(o.batch_size), compile=o.compile_, nproc=nproc_value(o.nproc))
    overrides = [*o.set_, *parameter_overrides(o.stage, flags)]
    path, params = resolve_params(o.params_file, o.iteration, overrides)
    from gptcore.distributed.group import world_from_env  # torch, once the parameters are known good
    from tasks.training_launch import launch_spec, launch_training

    preflight_inputs(params, o.train_tokens, o.validation_tokens, o.tokenizer)
    topology = dict(nnodes=o.nnodes, node_rank=o.node_rank, rdzv_endpoint=o.rdzv_endpoint)
    spec = launch_spec(params, {**topology, "rdzv_backend": o.rdzv_backend, "rdzv_id": o.rdzv_id})
    sources = _token_sources(params, o.stage, o.train_tokens, o.validation_tokens, o.synthetic)
    if sources[0] is None and not o.dry_run:
        raise ConfigError("--train-tokens: a training token file is required (or --synthetic, or --dry-run)")
    run_name = f"{Path(path).stem}-{o.stage}"
    job_fields = JobFields(
        train_tokens=sources[0],
        validation_tokens=sources[1],
        checkpoint_directory=o.checkpoint_directory or Path(params.paths.checkpoint_root) / run_name,
        resume=o.resume,
        dry_run=o.dry_run,
        tokenizer=o.tokenizer,
    )
    track = not (o.no_track or o.dry_run)
    # JSON lines and the MLflow run live in the launching process, or on the main rank of a torchrun the
    # user started (the other ranks report nothing).
    main_rank = spec is not None or world_from_env().is_main
    callbacks = training_callbacks(params, o.stage, track, Path(path), job_fields) if main_rank else []
    metadata = {"params_file": str(path), "stage": o.stage}
    launch_training(params, o.stage, callbacks, spec, metadata, **job_fields)


def generate_command(
    checkpoint_directory: Path | None = typer.Option(None, "--checkpoint-directory"),
    model: str | None = typer.Option(
        None, "--model", help="an MLflow model URI instead: models:/gptpipe-iteration-1@champion, models:/ID"
    ),
    prompt: str = typer.Option(..., "--prompt"),
    max_new_tokens: int = typer.Option(100, "--max-new-tokens", min=1),
    temperature: float = typer.Option(0.8, "--temperature", min=0.0),
    top_k: int = typer.Option(50, "--top-k", min=0, help="0 keeps every token"),
    tokenizer: Path | None = typer.Option(None, "--tokenizer", help="default: the one the checkpoint names"),
    checkpoint: str = typer.Option("auto", "--checkpoint", help="auto, final, best or latest"),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Sample a continuation of a prompt from a trained checkpoint or a logged MLflow model."""
    if (checkpoint_directory is None) == (model is None):
        raise ConfigError("gptpipe generate: give --checkpoint-directory DIR or --model URI (one of them)")
    if model is not None:
        result = _generate_from_model(model, prompt, max_new_tokens, temperature, top_k, seed)
    else:
        from gptcore.generate import generate_text

        generated = generate_text(
            checkpoint_directory,
            prompt,
            tokenizer,
            max_new_tokens,
            temperature,
            top_k or None,
            seed,
            checkpoint,
        )
        result = asdict(generated)
    print(json.dumps(result) if as_json else prompt + result["completion"])


def _generate_from_model(
    uri: str, prompt: str, max_new_tokens: int, temperature: float, top_k: int, seed: int
) -> dict[str, str]:
    """A completion from the model `uri` names (a logged or registered model, `hf:...`), its files read
    as data: the MLflow model's own code is not run."""
    import tempfile

    from gptcore.export.model_files import read_model_files
    from gptcore.generate import Completer
    from tasks.tracking.models.model_uri import model_files_of

    with tempfile.TemporaryDirectory(prefix="gptpipe-generate-") as scratch:
        files = model_files_of(uri, into=Path(scratch))
        model = read_model_files(
            files.weights, files.config, quantization=files.quantization, source=f"--model {uri}"
        )
        completer = Completer.from_paths(model, files.tokenizer)
        completion = completer.complete([prompt], max_new_tokens, temperature, top_k or None, seed)[0]
    return {"model": uri, "prompt": prompt, "completion": completion}
