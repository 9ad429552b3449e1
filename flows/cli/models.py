"""Using a trained model: `gptpipe merge` (a LoRA fine-tune's adapters folded into its weights),
`gptpipe serve` (many clients at once with batched decoding, OpenAI's completions API; on loopback
unless asked otherwise, `gptcore.serving`),
`gptpipe export` (a Hugging Face folder) and `gptpipe quantize` (the quantize stage's trade-off table
and quantized models for any fp32 model)."""

from __future__ import annotations

import socket
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from flows.cli.options import resolve_params
from flows.cli.tracking import is_loopback
from gptcore.errors import GptpipeError

if TYPE_CHECKING:
    from gptcore.data.tokenfile import TokenStream
    from gptcore.eval.quant_tradeoff import TradeoffRow
    from gptcore.export.model_files import ModelFiles
    from gptcore.model.gpt import GPT
    from gptcore.serving.app import CompletionServer
    from tasks.params.schema import PipelineParams
    from tasks.tracking.models.test_split import ChosenSplit


def import_command(
    model: str = typer.Argument(..., help="hf:FOLDER (a GPT2LMHeadModel folder) or hf:HUB_ID (e.g. hf:gpt2)"),
    name: str = typer.Option(..., "--name", help="the registered model it becomes a version of"),
    params_file: Path | None = typer.Option(None, "--params", help="parameter file naming the store"),
    iteration: int | None = typer.Option(None, "--iteration", min=1),
) -> None:
    """Import a GPT-2-family model from Hugging Face's format and register it (alias `imported`, its
    source and weights sha256 as tags), so models:/NAME/N fine-tunes, serves, exports and quantizes as
    gptpipe's own do."""
    import json

    from gptcore.errors import ConfigError
    from gptcore.tools.fingerprint import sha256_file
    from tasks.tracking import ParentRun
    from tasks.tracking.models.model_uri import HF, hf_model_files

    if not model.startswith(HF):
        raise ConfigError(f"gptpipe import {model}: expected hf:FOLDER or hf:HUB_ID (a GPT-2 in HF's format)")
    _, params = resolve_params(params_file, iteration, [])
    with tempfile.TemporaryDirectory(prefix="gptpipe-import-") as scratch:
        files = hf_model_files(model, Path(scratch))
        lineage = {"source": model, "weights_sha256": sha256_file(files.weights),
                   "tokenizer_sha256": sha256_file(files.tokenizer)}  # fmt: skip
        run = ParentRun.open(params.tracking, f"import-{name}", {"kind": "import", **lineage})
        registration = run.register_imported(name, files, lineage)
        run.finish()
    uri = f"models:/{name}/{registration.model_version}"
    print(json.dumps({"registered_model": name, "model_version": registration.model_version, "model_uri": uri,
                      "alias": registration.alias, **lineage}))  # fmt: skip


def models_command(
    name: str | None = typer.Argument(None, help="one registered model (default: every one)"),
    params_file: Path | None = typer.Option(None, "--params", help="parameter file naming the store"),
    iteration: int | None = typer.Option(None, "--iteration", min=1),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per version, a line each"),
) -> None:
    """List the registered models' versions, newest first: the aliases each holds (@champion, @challenger,
    a quantization method's), its decision, test bits per byte and the test split it was measured on.
    @champion is settled first, so the list names who holds it, whatever a run cut short left."""
    import json

    from tasks.tracking.models.listing import list_versions, versions_table

    _, params = resolve_params(params_file, iteration, [])
    versions = list_versions(params.tracking, name)
    if as_json:
        for version in versions:
            print(json.dumps(version.to_dict()))
    else:
        print(versions_table(versions) if versions else "no registered model yet: gptpipe run registers one")


def benchmark_command(
    model: str = typer.Option(..., "--model", help="models:/NAME@ALIAS, models:/NAME/N, hf:FOLDER, ..."),
    tasks: str = typer.Option(..., "--tasks", help="comma-separated harness tasks: hellaswag,arc_easy,..."),
    include_path: Path | None = typer.Option(
        None, "--include-path", help="a folder of tasks in the harness's YAML format (data files beside them)"
    ),
    limit: int | None = typer.Option(None, "--limit", min=1, help="the first N examples of each task"),
    num_fewshot: int | None = typer.Option(None, "--num-fewshot", min=0, help="default: each task's own"),
    batch_size: int = typer.Option(8, "--batch-size", min=1),
    params_file: Path | None = typer.Option(None, "--params", help="parameter file naming the store"),
    iteration: int | None = typer.Option(None, "--iteration", min=1),
) -> None:
    """Score a model on lm-evaluation-harness tasks, through the harness's own Hugging Face model class;
    prints one JSON line: every task's metrics (acc, acc_norm, their stderr, the samples scored)."""
    import json
    from importlib.metadata import version

    from gptcore.errors import ConfigError
    from gptcore.eval.benchmarks import BenchmarkRequest, check_folder, run_benchmarks

    chosen = tuple(task.strip() for task in tasks.split(",") if task.strip())
    if not chosen:
        raise ConfigError(f"--tasks {tasks!r}: name at least one task (hellaswag, arc_easy, ...)")
    check_folder(include_path)
    _, params = resolve_params(params_file, iteration, [])
    request = BenchmarkRequest(chosen, include_path, limit, num_fewshot, batch_size)
    with tempfile.TemporaryDirectory(prefix="gptpipe-benchmark-") as scratch:
        trained, files = _fp32_model(
            model, params, Path(scratch), "a {} model; the harness scores the fp32 one"
        )
        scores = run_benchmarks(trained, files.tokenizer, [request])
    print(json.dumps({"model": model, "tasks": scores.tasks, "lm_eval": version("lm_eval")}))


def merge_command(
    checkpoint_directory: Path | None = typer.Option(
        None, "--checkpoint-directory", help="a LoRA fine-tune's checkpoint folder"
    ),
    checkpoint: str = typer.Option(
        "auto", "--checkpoint", help="with --checkpoint-directory: auto, final, best, latest"
    ),
    checkpoint_file: Path | None = typer.Option(None, "--checkpoint-file", help="a checkpoint .pt file"),
    output: Path | None = typer.Option(
        None, "--output", help="the merged checkpoint's folder (default: merged/ beside the checkpoint)"
    ),
) -> None:
    """Merge a LoRA fine-tune's adapters into its weights: a plain checkpoint, which generate, export and
    quantize read, and the adapters alone beside it (`<name>-adapter/`)."""
    import json

    from gptcore.checkpoint.load import choose_checkpoint
    from gptcore.checkpoint.merge import MERGED
    from gptcore.errors import ConfigError
    from tasks.stages.merge import merge_adapted

    if (checkpoint_directory is None) == (checkpoint_file is None):
        raise ConfigError("gptpipe merge: give one of --checkpoint-directory or --checkpoint-file")
    path = checkpoint_file or choose_checkpoint(checkpoint_directory, checkpoint)
    folder = output or path.parent / MERGED
    done = merge_adapted([path], folder, path, folder / f"{path.stem}-adapter")
    merged, adapter = done.checkpoints[0], done.adapter
    print(json.dumps({"merged": str(merged.resolve()), "adapter": str(adapter.resolve()), "from": str(path)}))


def serve_command(
    model: str = typer.Option(
        ...,
        "--model",
        help="models:/gptpipe-iteration-1@champion, models:/NAME/VERSION, models:/ID or a model folder",
    ),
    params_file: Path | None = typer.Option(None, "--params", help="parameter file naming the store"),
    iteration: int | None = typer.Option(None, "--iteration", min=1),
    host: str = typer.Option("127.0.0.1", "--host", help="address to bind; loopback unless you ask"),
    port: int = typer.Option(
        5001, "--port", min=0, max=65535, help="0: a free port, named in the first line"
    ),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda (cuda without CUDA: refused)"),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="GPTPIPE_API_KEY",
        show_default=False,
        help="bearer token every request must carry; required with a --host other machines reach",
    ),
    max_batch: int = typer.Option(64, "--max-batch", min=1, max=1024, help="sequences decoded together"),
    step_tokens: int = typer.Option(
        256, "--step-tokens", min=2, help="tokens a step runs at most: the batch's next tokens, then prompts"
    ),
    max_queue: int = typer.Option(256, "--max-queue", min=0, help="sequences waiting at most (then 429)"),
    max_tokens: int = typer.Option(1024, "--max-tokens", min=1, help="new tokens a prompt may ask for"),
    request_timeout: float = typer.Option(60.0, "--request-timeout", min=0.1, help="seconds (then 504)"),
    max_prompts: int = typer.Option(32, "--max-prompts", min=1, help="prompts in one request at most"),
    max_body_bytes: int = typer.Option(1_000_000, "--max-body-bytes", min=1024, help="a body's bytes (413)"),
) -> None:
    """Serve a gptpipe model to many clients at once, with batched decoding. OpenAI clients point their
    base URL at http://HOST:PORT/v1 (POST /v1/completions, GET /v1/models); MLflow's POST /invocations
    body works too; GET /health and GET /metrics (Prometheus). The model's weights, settings and
    tokenizer are read as data, never as code. Ctrl-C or SIGTERM stops it."""

    from gptcore.errors import ConfigError
    from gptcore.runtime.device import resolve_device
    from gptcore.serving.config import ServeConfig

    if step_tokens <= max_batch:
        raise ConfigError(
            f"--step-tokens {step_tokens}: must exceed --max-batch {max_batch} (a step decodes the whole "
            "batch and runs prompt tokens with the rest)"
        )
    limits = ServeConfig(
        max_batch=max_batch, step_tokens=step_tokens, max_queue=max_queue, max_tokens_cap=max_tokens,
        request_timeout=request_timeout, max_prompts=max_prompts, max_body_bytes=max_body_bytes,
        api_key=api_key or None,
    )  # fmt: skip
    if not is_loopback(host) and not limits.api_key:
        raise ConfigError(
            f"--host {host}: other machines could reach the server; give --api-key KEY (or GPTPIPE_API_KEY)"
        )
    chosen = resolve_device(device)
    if chosen not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device}: the server runs on cpu or cuda, not {chosen}")
    from gptcore.serving.app import CompletionServer
    from gptcore.serving.served import load_served

    with tempfile.TemporaryDirectory(prefix="gptpipe-serve-") as scratch:
        files = _served_files(model, params_file, iteration, Path(scratch))
        listener = _listen(host, port)
        port = listener.getsockname()[1]  # the one the kernel gave, where --port 0 asked for any
        server = CompletionServer(lambda: load_served(files, model, chosen), limits).start()
        shown = f"[{host}]" if ":" in host else host
        print(
            f"serving {model} at http://{shown}:{port}/v1 (OpenAI completions; Ctrl-C stops it)", flush=True
        )
        _serve(server, listener)


def _served_files(model: str, params_file: Path | None, iteration: int | None, scratch: Path) -> ModelFiles:
    """The model files `--model` names: a local folder's, or a logged model's downloaded into `scratch`."""
    from gptcore.export.model_files import model_files_at
    from gptcore.serving.served import check_files
    from tasks.tracking.models.model_uri import model_files_of

    if Path(model).is_dir():
        files = model_files_at(Path(model))
    else:
        _, params = resolve_params(params_file, iteration, [])
        files = model_files_of(model, params.tracking, into=scratch)  # not a gptpipe model: refused here
    check_files(files, model)
    return files


def _listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the model loads: a port in use is one line, at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP by name: asyncio turns Nagle off only on sockets that say so, and with it on, a
    # response's headers and body wait a delayed ACK apart (40 ms on Linux).
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        raise GptpipeError(
            f"--host {host} --port {port}: cannot listen there ({error.strerror}); try --port"
        ) from None
    return listener


class _Stopped(Exception):
    """SIGTERM, raised once uvicorn has shut down (it raises the signal it stopped for again)."""


def _stopped(signum: int, frame: object) -> None:
    raise _Stopped


def _serve(server: CompletionServer, listener: socket.socket) -> None:
    """Answer on `listener` until Ctrl-C or SIGTERM, then stop the decode loop and return."""
    import signal

    import uvicorn

    from gptcore.serving.app import create_app

    config = uvicorn.Config(create_app(server), log_level="warning", timeout_graceful_shutdown=5)
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        uvicorn.Server(config).run(sockets=[listener])
    except (_Stopped, KeyboardInterrupt):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop()


EXPORT_FORMATS = {
    "hf": "the model as a Hugging Face folder (GPT-2's layout, or Llama's / Qwen3's); a fine-tune's merged",
    "peft": "a LoRA or QLoRA fine-tune's adapter alone, in PEFT's format",
    "hf-base": "the base a fine-tune's adapter applies to, as a Hugging Face folder",
}


def export_command(
    output: Path = typer.Option(..., "--output", help="the folder to write (refused when not empty)"),
    format_: str = typer.Option(
        "hf", "--format", help="; ".join(f"{name}: {what}" for name, what in EXPORT_FORMATS.items())
    ),
    checkpoint_directory: Path | None = typer.Option(None, "--checkpoint-directory"),
    checkpoint: str = typer.Option(
        "best", "--checkpoint", help="with --checkpoint-directory: best, final, latest"
    ),
    checkpoint_file: Path | None = typer.Option(None, "--checkpoint-file", help="a checkpoint .pt file"),
    model: str | None = typer.Option(None, "--model", help="an MLflow model URI: models:/NAME@ALIAS, ..."),
    tokenizer: Path | None = typer.Option(None, "--tokenizer", help="default: the one the checkpoint names"),
    params_file: Path | None = typer.Option(None, "--params", help="parameter file naming the store"),
    iteration: int | None = typer.Option(None, "--iteration", min=1),
    force: bool = typer.Option(False, "--force", help="replace a folder an earlier export wrote"),
) -> None:
    """Export a trained model as a Hugging Face folder (`transformers` loads it offline), or a LoRA
    fine-tune's adapter in PEFT's format (`peft` loads it onto the `hf-base` export)."""
    import json

    from gptcore.errors import ConfigError
    from tasks.params.loading import choice

    choice("--format", format_, tuple(EXPORT_FORMATS))
    sources = [source for source in (checkpoint_directory, checkpoint_file, model) if source is not None]
    if len(sources) != 1:
        raise ConfigError("gptpipe export: give one of --checkpoint-directory, --checkpoint-file or --model")
    with tempfile.TemporaryDirectory(prefix="gptpipe-model-") as scratch:  # a downloaded model's files
        if model is not None:
            folder = _export_model(model, format_, output, tokenizer, params_file, iteration, force, scratch)
        else:
            from gptcore.checkpoint.load import choose_checkpoint
            from tasks.stages.export import export_checkpoint

            path = checkpoint_file or choose_checkpoint(checkpoint_directory, checkpoint)
            folder = export_checkpoint(path, output, tokenizer, force=force, part=format_)
    print(json.dumps({"format": format_, "output": str(folder.resolve()), "source": str(sources[0])}))


def _export_model(
    model: str, format_: str, output: Path, tokenizer: Path | None, params_file: Path | None,
    iteration: int | None, force: bool, scratch: str,
) -> Path:  # fmt: skip
    """`gptpipe export --model`: the registered model's files exported as `format_` says."""
    from gptcore.checkpoint.merge import read_adapter_files
    from gptcore.errors import ConfigError
    from tasks.stages.export import export_part
    from tasks.tracking.models.model_uri import card_facts_of

    _, params = resolve_params(params_file, iteration, [])
    refusal = "a {} model; the export takes the fp32 one (the checkpoint it was quantized from)"
    trained, files = _fp32_model(model, params, Path(scratch), refusal)
    adapter = None
    if format_ != "hf":
        if files.adapter is None:
            raise ConfigError(
                f"--model {model}: its files hold no adapter (not a LoRA or QLoRA fine-tune's merged model); "
                f"--format {format_} takes one"
            )
        adapter = read_adapter_files(files.adapter, source=f"--model {model}")
    facts = card_facts_of(model, params.tracking)  # the model card: what the registry says of it
    return export_part(format_, trained, adapter, Path(tokenizer or files.tokenizer), output, force, facts)


METHODS_HELP = "comma-separated: fp32, bf16, int8-weight-only, int8-dynamic, int4-weight-only"


def quantize_command(
    model: str = typer.Option(..., "--model", help="the fp32 model: models:/NAME@ALIAS, models:/NAME/N, ..."),
    methods: str = typer.Option("int8-weight-only", "--methods", help=METHODS_HELP),
    test_tokens: Path | None = typer.Option(
        None, "--test-tokens", help="default: the model's own test split, found under the data root"
    ),
    output: Path | None = typer.Option(None, "--output", help="default: <checkpoint root>/quantized-<hash>"),
    params_file: Path | None = typer.Option(None, "--params", help="parameter file: store, settings, paths"),
    iteration: int | None = typer.Option(None, "--iteration", min=1),
    register: bool = typer.Option(
        True, "--register/--no-register", help="with models:/NAME...: register each as a version of NAME"
    ),
) -> None:
    """Quantize a model as the quantize stage does: a row per method beside fp32 (printed, written as
    tradeoff.json and tradeoff.md), and with a registered model each quantized model registered as a
    version tagged quantization=<method>, with the alias @<method>."""
    import json

    from gptcore.errors import ConfigError
    from gptcore.eval.config import QuantizationMethod
    from gptcore.tools.fingerprint import sha256_file
    from tasks.params.loading import choice
    from tasks.stages.quantize import measure_quantized
    from tasks.tracking.models.test_split import split_tags

    _, params = resolve_params(params_file, iteration, [])
    chosen = [
        choice("--methods", name.strip(), QuantizationMethod) for name in methods.split(",") if name.strip()
    ]
    if not chosen:
        raise ConfigError(f"--methods {methods!r}: expected {METHODS_HELP}")
    with tempfile.TemporaryDirectory(prefix="gptpipe-model-") as scratch:  # a downloaded model's files
        refusal = "already {}; quantize the fp32 model it came from"
        trained, files = _fp32_model(model, params, Path(scratch), refusal)
        data_root = Path(params.paths.data_root)
        chosen_split = _test_split(model, params, test_tokens, files.tokenizer, data_root)
        test = _test_stream(chosen_split.path, files.tokenizer, trained.config.vocab_size)
        folder = output or Path(params.paths.checkpoint_root) / f"quantized-{sha256_file(files.weights)[:16]}"
        settings = params.quantize.model_copy(update={"methods": chosen})
        measured = measure_quantized(
            trained, chosen, test, files.tokenizer, settings, params.evaluate, folder
        )
    print(measured.table(), file=sys.stderr)
    split = split_tags(chosen_split.path)
    registered = _register_tradeoff(model, params, measured.rows, folder, split) if register else {}
    summary = {"model": model, "output": str(folder.resolve()), "registered": registered}
    print(json.dumps({**summary, "rows": [row.to_dict() for row in measured.rows]}))


def _fp32_model(model: str, params: PipelineParams, scratch: Path, refusal: str) -> tuple[GPT, ModelFiles]:
    """The fp32 model `--model` names, read from its files (a logged model's downloaded into `scratch`),
    and those files; a quantized one is refused: `--model MODEL: <refusal>`, its method put in for `{}`."""
    from gptcore.errors import ConfigError
    from gptcore.export.model_files import read_model_files
    from tasks.tracking.models.model_uri import model_files_of

    files = model_files_of(model, params.tracking, into=scratch)
    if files.method != "fp32":
        raise ConfigError(f"--model {model}: {refusal.format(files.method)}")
    return read_model_files(files.weights, files.config, source=f"--model {model}"), files


def _test_split(
    model: str, params: PipelineParams, given: Path | None, tokenizer: Path, data_root: Path
) -> ChosenSplit:
    """The test split to measure `model` on (`test_split.own_split`: its own unless `--test-tokens` says
    otherwise), and a line on stderr naming it."""
    from gptcore.data.tokenfile import find_test_tokens
    from tasks.tracking.models.model_uri import recorded_split
    from tasks.tracking.models.test_split import own_split

    recorded = recorded_split(model, params.tracking)
    chosen = own_split(model, recorded, given, data_root, lambda: find_test_tokens(tokenizer, data_root))
    print(f"quantize: {chosen.line}", file=sys.stderr)
    return chosen


def _test_stream(path: Path, tokenizer: Path, vocab_size: int) -> TokenStream:
    """The held-out test tokens at `path`, checked to be made with the model's tokenizer."""
    from gptcore.data.tokenfile import check_tokenizer, open_tokens

    test = open_tokens(path)
    check_tokenizer(tokenizer, vocab_size, (test,))
    return test


def _register_tradeoff(
    model: str, params: PipelineParams, rows: list[TradeoffRow], folder: Path, split: dict[str, str]
) -> dict[str, str]:
    """The table on a new run beside the one that trained the model (its experiment), and each quantized
    model a version of the registered model `model` names (nothing for a logged model's id or a folder):
    each method's URI."""
    from tasks.tracking.models.quantized import register_tradeoff

    may_win = params.quantize.may_hold_champion
    done = register_tradeoff(params.tracking, model, rows, folder, may_win, split)
    if done is None:
        print(f"{model}: not a registered fp32 version, so nothing is registered", file=sys.stderr)
        return {}
    for found in done.values():
        if found.not_compared:
            print(
                f"{found.registered_model} version {found.model_version}: {found.not_compared}",
                file=sys.stderr,
            )
    return {
        method: f"models:/{found.registered_model}/{found.model_version}" for method, found in done.items()
    }
