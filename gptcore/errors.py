"""Errors a user can act on: the CLI prints them as one line and exits non-zero, without a traceback."""


class GptpipeError(Exception):
    """A problem with the user's input or machine, stated in one line that names what and where."""

    exit_code = 1

    def __init__(self, *args: object, exit_code: int | None = None) -> None:
        super().__init__(*args)
        if exit_code is not None:  # the process's own status: a failed child's, say
            self.exit_code = exit_code


class ConfigError(GptpipeError):
    """A parameter file, `--set` override or command-line value that is not allowed."""

    exit_code = 2


class DeviceError(GptpipeError):
    """The requested device or precision is not available on this machine."""

    exit_code = 2


class DataError(GptpipeError):
    """A corpus, tokenizer or token file that is missing, empty or inconsistent."""

    exit_code = 2


class CheckpointError(GptpipeError):
    """A checkpoint that cannot be written, read or resumed from."""

    exit_code = 1


class TrainingError(GptpipeError):
    """Training stopped for a reason the user must act on (non-finite loss, out of memory)."""

    exit_code = 1


class DiskFullError(GptpipeError):
    """A write ran out of disk space (or quota): what, how much it needs, and that nothing was left half."""


def first_line(error: BaseException | str, limit: int | None = None) -> str:
    """An error (or a message) as one line: its first line (at most `limit` characters); an error with
    no message is its type's name (a signal, a bare KeyboardInterrupt), an empty message is empty."""
    text = str(error).strip() or (type(error).__name__ if isinstance(error, BaseException) else "")
    line = text.splitlines()[0] if text else ""
    return line[:limit] if limit else line
