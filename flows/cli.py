"""`gptpipe`: the command line, a thin door onto flows and gptcore.

Each subcommand lives in its own module and imports heavy libraries (torch, Prefect, MLflow) only when
it runs, so `gptpipe --help` and bad flags answer quickly. Every failure a user can act on comes out as
one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import sys

import click
import typer

from gptcore.errors import GptpipeError

app = typer.Typer(
    name="gptpipe",
    help="Train a GPT from raw text to a measured checkpoint: Prefect pipeline, MLflow tracking.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _register_commands() -> None:
    # Imported for their side effect of adding commands to `app`.
    from flows import cli_pipeline, cli_tracking, cli_train  # noqa: F401


def _usage_line(error: click.UsageError) -> str:
    command = error.ctx.command_path if error.ctx else "gptpipe"
    return f"error: {command}: {error.format_message()}"


def main(argv: list[str] | None = None) -> int:
    _register_commands()
    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name="gptpipe", standalone_mode=False)
    except click.UsageError as error:
        print(_usage_line(error), file=sys.stderr)
        return 2
    except click.exceptions.Abort:
        print("error: aborted", file=sys.stderr)
        return 130
    except click.exceptions.Exit as exit_:
        return exit_.exit_code
    except GptpipeError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
