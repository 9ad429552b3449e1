"""Using a trained model: `gptpipe serve` (a logged model behind MLflow's own model server, on loopback
unless asked otherwise) and `gptpipe export` (a Hugging Face folder)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from flows.cli_options import resolve_params
from flows.cli_tracking import is_loopback
from gptcore.errors import GptpipeError


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
    from gptcore.launch import run_process_tree
    from tasks.tracking.model_uri import locate

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

    from flows.cli_options import choice
    from gptcore.errors import ConfigError
    from gptcore.hf_export import export_hf

    choice("--format", format_, ("hf",))
    sources = [source for source in (checkpoint_directory, checkpoint_file, model) if source is not None]
    if len(sources) != 1:
        raise ConfigError("gptpipe export: give one of --checkpoint-directory, --checkpoint-file or --model")
    if model is not None:
        from gptcore.model_files import read_model_files
        from tasks.tracking.model_uri import model_files_of

        _, params = resolve_params(params_file, iteration, [])
        files = model_files_of(model, params.tracking)
        if files.method != "fp32":
            raise ConfigError(
                f"--model {model}: a {files.method} model; the Hugging Face export takes the fp32 one "
                "(the checkpoint it was quantized from)"
            )
        trained, tokenizer_path = read_model_files(files.weights, files.config), tokenizer or files.tokenizer
    else:
        from gptcore.generate import choose_checkpoint, load_model
        from gptcore.model_files import checkpoint_tokenizer

        path = checkpoint_file or choose_checkpoint(checkpoint_directory, checkpoint)
        trained, record = load_model(path)
        tokenizer_path = tokenizer or checkpoint_tokenizer(record)
    folder = export_hf(trained, Path(tokenizer_path), output, force=force)
    print(json.dumps({"format": format_, "output": str(folder.resolve()), "source": str(sources[0])}))
