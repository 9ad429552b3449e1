"""`gptpipe`: the command line, a thin door onto flows and gptcore.

The commands are plain functions in `pipeline.py` (run, sweep, scale, finetune), `train.py` (device, train,
generate), `chat.py` (chat), `models.py` (merge, import, models, serve, export, quantize, benchmark),
`tracking.py` (ui, compare, tracking replay) and `servers.py` (servers), registered here and nowhere else;
what several take alike (the parameter file, choices from the config's types) is in `options.py`. They
import heavy libraries (torch, Prefect, MLflow) only when they run, so `gptpipe --help` and bad flags answer
quickly. Every failure a user can act on comes out as one line on stderr and a non-zero exit, never a
traceback.
"""

from __future__ import annotations

import os
import sys

import click
import typer

from flows.cli.dependencies import missing_dependency
from flows.environment.gc_tuning import freeze_before_exit
from gptcore.errors import GptpipeError
from gptcore.runtime.malloc import tune_malloc

# typer >= 0.2x raises its own vendored click's exceptions, not the installed click's: catch both.
try:
    from typer._click import exceptions as _typer_click

    USAGE_ERRORS: tuple[type[Exception], ...] = (click.UsageError, _typer_click.UsageError)
except ImportError:  # an older typer on the real click
    USAGE_ERRORS = (click.UsageError,)
ABORTS = (click.exceptions.Abort, typer.Abort)
EXITS = (click.exceptions.Exit, typer.Exit)

app = typer.Typer(
    name="gptpipe",
    help="Train a GPT from raw text to a measured checkpoint: Prefect pipeline, MLflow tracking.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _options(
    verbose: bool = typer.Option(
        False, "--verbose", help="the libraries' INFO logs too (MLflow's model validation, its monitors)"
    ),
) -> None:
    """Options of every command (`gptpipe --verbose run`)."""
    quiet_libraries(verbose)


def quiet_libraries(verbose: bool) -> None:
    """A person sees the stages, their results and real warnings: MLflow's INFO lines (a model's input
    example validated, the system-metrics monitor started) only with `--verbose`. Through the
    environment, before MLflow is imported, so the processes a command starts keep to it too."""
    if verbose:
        os.environ["MLFLOW_LOGGING_LEVEL"] = "INFO"
    else:
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")


def _register_commands() -> None:
    """Every command, in the order `--help` lists them; each module defines plain functions."""
    if app.registered_commands:
        return
    from flows.cli.chat import chat_command
    from flows.cli.models import (
        benchmark_command,
        export_command,
        import_command,
        merge_command,
        models_command,
        quantize_command,
        serve_command,
    )
    from flows.cli.pipeline import finetune_command, run, scale_command, sweep_command
    from flows.cli.servers import servers_command
    from flows.cli.tracking import compare_command, replay_command, ui_command
    from flows.cli.train import device_command, generate_command, train_command

    for name, command in (
        ("run", run),
        ("sweep", sweep_command),
        ("scale", scale_command),
        ("finetune", finetune_command),
        ("merge", merge_command),
        ("import", import_command),
        ("models", models_command),
        ("device", device_command),
        ("train", train_command),
        ("generate", generate_command),
        ("chat", chat_command),
        ("serve", serve_command),
        ("export", export_command),
        ("quantize", quantize_command),
        ("benchmark", benchmark_command),
        ("ui", ui_command),
        ("compare", compare_command),
        ("servers", servers_command),
    ):
        app.command(name)(command)
    tracking = typer.Typer(name="tracking", help="The tracking records of runs whose store was away.")
    tracking.command("replay")(replay_command)
    app.add_typer(tracking)


def _usage_line(error: Exception) -> str:
    ctx = getattr(error, "ctx", None)
    command = ctx.command_path if ctx else "gptpipe"
    return f"error: {command}: {error.format_message()}"


def main(argv: list[str] | None = None) -> int:
    tune_malloc()  # before anything imports torch, or it does not take (see gptcore.runtime.malloc)
    try:
        return _run(argv)
    except ModuleNotFoundError as error:  # a dependency not installed here (a bare GPU image, say)
        missing = missing_dependency(error)
        if missing is None:
            raise
        print(f"error: {missing}", file=sys.stderr)
        return missing.exit_code


def _run(argv: list[str] | None) -> int:
    _register_commands()
    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name="gptpipe", standalone_mode=False)
    except USAGE_ERRORS as error:
        print(_usage_line(error), file=sys.stderr)
        return 2
    except ABORTS:
        print("error: aborted", file=sys.stderr)
        return 130
    except EXITS as exit_:
        return exit_.exit_code
    except GptpipeError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return result if isinstance(result, int) else 0


def entry() -> None:
    """The `gptpipe` process: `main`, then an exit that spares the final collection what is still alive
    (in-process callers such as tests use `main`, whose objects stay collectable)."""
    code = main()
    freeze_before_exit()
    from gptcore.distributed.torchrun import under_torchrun

    if under_torchrun():
        from gptcore.distributed.group import leave_rank

        leave_rank(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
