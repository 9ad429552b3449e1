"""Errors a user can act on: the CLI prints them as one line and exits non-zero, without a traceback."""


class GptpipeError(Exception):
    """A problem with the user's input or machine, stated in one line that names what and where."""

    exit_code = 1


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


class MissingDependency(GptpipeError):
    """A package the command imports is not installed: named, with the pip line and any way around it."""

    exit_code = 1


# Where an import name is not the name pip installs.
_DISTRIBUTIONS = {"yaml": "pyyaml", "google": "protobuf"}
# What a user can do without the package, where something runs without it.
_WAYS_AROUND = {
    "mlflow": "or add --no-track (gptpipe train, gptpipe compare) to run without MLflow",
    "prefect": "or use gptpipe train, or gptpipe compare --no-track, which run without Prefect",
}
_PROJECT_PACKAGES = ("gptcore", "tasks", "flows")


def missing_dependency(error: ModuleNotFoundError) -> MissingDependency | None:
    """The one-line error for an import of a package that is not installed; None for the project's own
    modules (a missing one of those is a broken checkout, whose traceback is the useful answer)."""
    module = (error.name or "").split(".")[0]
    if not module or module in _PROJECT_PACKAGES:
        return None
    package = _DISTRIBUTIONS.get(module, module.replace("_", "-"))
    requirement = _requirement(package)
    message = f"the Python package {package!r} is not installed: pip install '{requirement}'"
    if module in _WAYS_AROUND:
        message += f", {_WAYS_AROUND[module]}"
    return MissingDependency(message)


def _requirement(package: str) -> str:
    """The project's own requirement for the package (pyproject.toml), else its bare name."""
    import re
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text())["project"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return package
    wanted = re.sub(r"[-_.]+", "-", package).lower()
    requirements = [*project.get("dependencies", [])]
    for extra in project.get("optional-dependencies", {}).values():
        requirements.extend(extra)
    for requirement in requirements:
        name = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0]
        if re.sub(r"[-_.]+", "-", name).lower() == wanted:
            return requirement
    return package


class DiskFullError(GptpipeError):
    """A write ran out of disk space (or quota): what, how much it needs, and that nothing was left half."""


def first_line(error: BaseException, limit: int | None = None) -> str:
    """An error as one line: its message's first line (at most `limit` characters), or its type's name
    when it has no message (a signal, a bare KeyboardInterrupt)."""
    text = str(error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    return line[:limit] if limit else line
