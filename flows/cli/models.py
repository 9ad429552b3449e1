"""Using a trained model: `gptpipe merge` (a LoRA fine-tune's adapters folded into its weights),
`gptpipe serve` (a logged model behind MLflow's own model server, on loopback unless asked otherwise),
`gptpipe export` (a Hugging Face folder) and `gptpipe quantize` (the quantize stage's trade-off table
and quantized models for any fp32 model)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from flows.cli.options import resolve_params
from flows.cli.tracking import is_loopback
from gptcore.errors import GptpipeError


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
    from gptcore.checkpoint.merge import MERGED, merge_checkpoint, write_adapter
    from gptcore.errors import ConfigError

    if (checkpoint_directory is None) == (checkpoint_file is None):
        raise ConfigError("gptpipe merge: give one of --checkpoint-directory or --checkpoint-file")
    path = checkpoint_file or choose_checkpoint(checkpoint_directory, checkpoint)
    folder = output or path.parent / MERGED
    merged = merge_checkpoint(path, folder)
    adapter = write_adapter(path, folder / f"{path.stem}-adapter")
    print(json.dumps({"merged": str(merged.resolve()), "adapter": str(adapter.resolve()), "from": str(path)}))


def serve_command(
    model: str = typer.Option(
        ...,
        "--model",
        help="models:/gptpipe-iteration-1@champion, models:/NAME/VERSION, models:/ID or a folder",
    ),
    params_file: Path | None = typer.Option(None, "--params", help="parameter file naming the store"),
    iteration: int | None = typer.Option(None, "--iteration", min=1),
    host: str = typer.Option("127.0.0.1", "--host", help="address to bind; loopback unless you ask"),
    port: int = typer.Option(5001, "--port", min=1, max=65535),
) -> None:
    """Serve a logged model (`mlflow models serve`): POST /invocations with
    {"inputs": ["def main("], "params": {"max_new_tokens": 40}} answers {"predictions": [...]}.
    Ctrl-C or SIGTERM stops the server and every process it started."""
    from gptcore.tools.processes import run_process_tree
    from tasks.tracking.models.model_uri import locate

    _, params = resolve_params(params_file, iteration, [])
    location, target = locate(model, params.tracking)  # a store or model that is not there stops here
    if not is_loopback(host):
        print(
            f"warning: --host {host}: the model server will be reachable from other machines", file=sys.stderr
        )
    shown = f"[{host}]" if ":" in host else host
    print(f"serving {model} at http://{shown}:{port}/invocations  (Ctrl-C stops it)", flush=True)
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", location, "--env-manager", "local"]
    command += ["-h", host, "-p", str(port)]
    # MLflow starts uvicorn by name: this interpreter's scripts must come first on PATH.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["MLFLOW_TRACKING_URI"] = target.uri
    try:
        code = run_process_tree(command, lambda line: print(line, file=sys.stderr, flush=True), env=env)
    except KeyboardInterrupt:
        return
    if code not in (0, -2, -15, 130, 143):
        raise GptpipeError(f"the model server exited with status {code} (is port {port} in use? try --port)")


def export_command(
    output: Path = typer.Option(..., "--output", help="the folder to write (refused when not empty)"),
    format_: str = typer.Option("hf", "--format", help="hf: a Hugging Face GPT-2 folder"),
    checkpoint_directory: Path | None = typer.Option(None, "--checkpoint-directory"),
    checkpoint: str = typer.Option(
        "best", "--checkpoint", help="with --checkpoint-directory: best, final, latest"
    ),
    checkpoint_file: Path | None = typer.Option(None, "--checkpoint-file", help="a checkpoint .pt file"),
    model: str | None = typer.Option(None, "--model", help="an MLflow model URI: models:/NAME@ALIAS, ..."),
    tokenizer: Path | None = typer.Option(None, "--tokenizer", help="default: the one the checkpoint names"),
    params_file: Path | None = typer.Option(None, "--params", help="parameter file naming the store"),
    iteration: int | None = typer.Option(None, "--iteration", min=1),
    force: bool = typer.Option(False, "--force", help="replace a folder that is not empty"),
) -> None:
    """Export a trained model as a Hugging Face GPT-2 folder (`transformers` loads it offline)."""
    import json

    from gptcore.errors import ConfigError
    from gptcore.export.hf import export_hf
    from tasks.params.loading import choice

    choice("--format", format_, ("hf",))
    sources = [source for source in (checkpoint_directory, checkpoint_file, model) if source is not None]
    if len(sources) != 1:
        raise ConfigError("gptpipe export: give one of --checkpoint-directory, --checkpoint-file or --model")
    if model is not None:
        from gptcore.export.model_files import read_model_files
        from tasks.tracking.models.model_uri import model_files_of

        _, params = resolve_params(params_file, iteration, [])
        files = model_files_of(model, params.tracking)
        if files.method != "fp32":
            raise ConfigError(
                f"--model {model}: a {files.method} model; the Hugging Face export takes the fp32 one "
                "(the checkpoint it was quantized from)"
            )
        trained, tokenizer_path = read_model_files(files.weights, files.config), tokenizer or files.tokenizer
    else:
        from gptcore.checkpoint.load import choose_checkpoint, load_model
        from gptcore.export.model_files import checkpoint_tokenizer

        path = checkpoint_file or choose_checkpoint(checkpoint_directory, checkpoint)
        trained, record = load_model(path)
        tokenizer_path = tokenizer or checkpoint_tokenizer(record)
    folder = export_hf(trained, Path(tokenizer_path), output, force=force)
    print(json.dumps({"format": format_, "output": str(folder.resolve()), "source": str(sources[0])}))


METHODS_HELP = "comma-separated: fp32, bf16, int8-weight-only, int8-dynamic, int4-weight-only"


def quantize_command(
    model: str = typer.Option(..., "--model", help="the fp32 model: models:/NAME@ALIAS, models:/NAME/N, ..."),
    methods: str = typer.Option("int8-weight-only", "--methods", help=METHODS_HELP),
    test_tokens: Path | None = typer.Option(
        None, "--test-tokens", help="default: the newest test.bin under the data root from its tokenizer"
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
    from gptcore.eval.quant_tradeoff import measure_tradeoff, tradeoff_markdown, write_tradeoff
    from gptcore.export.model_files import read_model_files
    from gptcore.model.quantization import cpu_features
    from gptcore.tools.fingerprint import sha256_file
    from tasks.params.loading import choice
    from tasks.tracking.models.model_uri import model_files_of

    _, params = resolve_params(params_file, iteration, [])
    chosen = [
        choice("--methods", name.strip(), QuantizationMethod) for name in methods.split(",") if name.strip()
    ]
    if not chosen:
        raise ConfigError(f"--methods {methods!r}: expected {METHODS_HELP}")
    files = model_files_of(model, params.tracking)
    if files.method != "fp32":
        raise ConfigError(f"--model {model}: already {files.method}; quantize the fp32 model it came from")
    trained = read_model_files(files.weights, files.config)
    test = _test_stream(test_tokens, files.tokenizer, trained.config.vocab_size, Path(params.paths.data_root))
    folder = output or Path(params.paths.checkpoint_root) / f"quantized-{sha256_file(files.weights)[:16]}"
    settings = params.quantize.model_copy(update={"methods": chosen})
    rows = measure_tradeoff(trained, chosen, test, files.tokenizer, settings, params.evaluate, folder)
    machine = cpu_features()
    write_tradeoff(rows, machine, folder)
    print(tradeoff_markdown(rows, machine), file=sys.stderr)
    registered = _register_tradeoff(model, params, rows, folder) if register else {}
    summary = {"model": model, "output": str(folder.resolve()), "registered": registered}
    print(json.dumps({**summary, "rows": [row.to_dict() for row in rows]}))


def _test_stream(given: Path | None, tokenizer: Path, vocab_size: int, data_root: Path) -> object:
    """The held-out test tokens to measure on: `given`, else the newest made with the model's tokenizer."""
    from gptcore.data.tokenfile import check_tokenizer, find_test_tokens, open_tokens
    from gptcore.errors import DataError

    path = given or find_test_tokens(tokenizer, data_root)
    if path is None:
        raise DataError(
            f"--test-tokens: no test.bin under {data_root}/tokens made with this model's tokenizer "
            "(gptpipe run builds one); pass --test-tokens PATH"
        )
    test = open_tokens(path)
    check_tokenizer(tokenizer, vocab_size, (test,))
    return test


def _register_tradeoff(model: str, params: object, rows: list, folder: Path) -> dict[str, str]:
    """The table on a new run beside the one that trained the model (its experiment), and each quantized
    model a version of the registered model `model` names (nothing for a logged model's id or a folder):
    each method's URI."""
    from tasks.tracking.models.model_uri import registered_version
    from tasks.tracking.models.quantized import record_tradeoff
    from tasks.tracking.store import connect, resolve_target

    client = connect(resolve_target(params.tracking))
    source = registered_version(client, model)
    if source is None or "checkpoint_sha256" not in source.tags or not source.run_id:
        print(f"{model}: not a registered fp32 version, so nothing is registered", file=sys.stderr)
        return {}
    experiment = client.get_run(source.run_id).info.experiment_id
    run_id = client.create_run(experiment, run_name="quantize", tags={"source_model": model}).info.run_id
    folders = {row.method: str(folder / row.method) for row in rows if row.measured}
    table = [row.to_dict() for row in rows]
    digest, may_win = source.tags["checkpoint_sha256"], params.quantize.may_hold_champion
    try:
        done = record_tradeoff(client, experiment, run_id, source.name, table, folders, digest, may_win)
    finally:
        client.set_terminated(run_id)
    return {method: f"models:/{source.name}/{found.model_version}" for method, found in done.items()}
