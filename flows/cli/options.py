"""What several `gptpipe` commands take the same way: the parameter file and choices from the config's types.

Importing this is cheap (no torch, no pydantic): `gptpipe --help` and bad flags answer at once.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import inspect
import os
import shutil
import tempfile
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptcore.errors import ConfigError

if TYPE_CHECKING:
    from tasks.params.schema import PipelineParams


def params_path(params_file: Path | None, iteration: int | None) -> Path:
    """`--params FILE` or `--iteration N` (params/iteration_N.yaml); neither: iteration 1's."""
    from tasks.params.loading import iteration_file

    if params_file is not None and iteration is not None:
        raise ConfigError("--params and --iteration name the parameters twice; give one of them")
    return params_file if params_file is not None else iteration_file(iteration or 1)


def resolve_params(
    params_file: Path | None, iteration: int | None, overrides: list[str]
) -> tuple[Path, PipelineParams]:
    """The parameter file and its validated parameters, `--set` overrides applied. A file that can be
    read only once (a pipe: `--params <(...)`) is read into a regular copy the stages read after."""
    from tasks.params.loading import load_params

    path = regular_copy(params_path(params_file, iteration))
    return path, load_params(path, overrides)


def regular_copy(path: Path) -> Path:
    """`path` itself when it is a regular file (or missing: the loader says so); else its content, read
    once, as `params-<sha256 prefix>.yaml` in a folder removed when this process exits."""
    if not path.exists() or path.is_file() or path.is_dir():
        return path
    try:
        content = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"{path}: the parameter file cannot be read ({error.strerror or error})") from None
    folder = Path(tempfile.mkdtemp(prefix="gptpipe-params-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    copy = folder / f"params-{hashlib.sha256(content).hexdigest()[:12]}.yaml"
    copy.write_bytes(content)
    return copy


def batch_size_value(text: str | None) -> int | str | None:
    """`--batch-size`: a whole number of at least 1, or `auto` (the largest that fits)."""
    if text is None or text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"--batch-size {text!r}: expected a whole number of at least 1, or auto")
    return int(text)


def json_lines_only(asked: bool) -> None:
    """`--json`: no progress bar, JSON lines alone, also on a terminal (for this process and its children)."""
    if asked:
        from gptcore.tools.console import JSON_ONLY

        os.environ[JSON_ONLY] = "1"


def command_of(options: type) -> Callable[[Callable[[Any], None]], Callable[..., None]]:
    """Decorate `body(options)` into a typer command whose flags are the fields of the dataclass
    `options` (each field's default is its `typer.Option`): the command's options arrive as one typed
    object, however many flags it has."""

    def decorate(body: Callable[[Any], None]) -> Callable[..., None]:
        hints = typing.get_type_hints(options)
        fields = dataclasses.fields(options)

        @functools.wraps(body)
        def command(**values: Any) -> None:
            return body(options(**values))

        keyword = inspect.Parameter.KEYWORD_ONLY
        command.__signature__ = inspect.Signature(  # what typer reads the flags from
            [inspect.Parameter(f.name, keyword, default=f.default, annotation=hints[f.name]) for f in fields]
        )
        command.__annotations__ = {f.name: hints[f.name] for f in fields} | {"return": None}
        del command.__wrapped__  # typer would read `body`'s signature through it
        return command

    return decorate


def nproc_value(raw: str | None) -> int | str | None:
    """`--nproc`: a positive integer or `auto`, as `runtime.nproc` holds it."""
    if raw is None or raw == "auto":
        return raw
    if raw.isdigit() and int(raw) >= 1:
        return int(raw)
    raise ConfigError(f"--nproc {raw!r}: expected a positive integer or auto")
