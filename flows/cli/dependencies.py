"""A package a command imports that is not installed: one line naming it, the line that installs it (the
project's own requirement, by this environment's installer), and any way around it."""

from __future__ import annotations

from gptcore.errors import GptpipeError


class MissingDependency(GptpipeError):
    """A package the command imports is not installed: named, with the pip line and any way around it."""

    exit_code = 1


# Where an import name is not the name pip installs.
_DISTRIBUTIONS = {"yaml": "pyyaml", "google": "protobuf", "psycopg": "psycopg[binary]"}
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
    message = f"the Python package {package!r} is not installed: {install_command()} '{requirement}'"
    if module in _WAYS_AROUND:
        message += f", {_WAYS_AROUND[module]}"
    return MissingDependency(message)


def install_command() -> str:
    """How this environment installs a package: its own pip, else the uv beside its Python (the Makefile
    makes the venv without pip), named by path so that no other environment's pip is meant."""
    import sys
    from pathlib import Path

    uv = Path(sys.executable).with_name("uv")
    if not has_pip() and uv.is_file():
        return f"{uv} pip install --python {sys.executable}"
    return "pip install"


def has_pip() -> bool:
    """Whether pip is installed here, read from its metadata: `importlib.util.find_spec("pip")` would
    make setuptools' distutils shim stand down for the rest of the process (it takes any look for pip for
    pip running), and torch's compiler then fails on the standard library's distutils."""
    from importlib import metadata

    try:
        metadata.distribution("pip")
    except metadata.PackageNotFoundError:
        return False
    return True


def _requirement(package: str) -> str:
    """The project's own requirement for the package (pyproject.toml), else its bare name."""
    import re
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
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
