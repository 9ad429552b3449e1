"""Reading a parameter file: safe YAML, `--set` overrides, the model profile resolved, validation as
one line naming the file, the key path, the value and what is allowed."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gptcore.errors import ConfigError
from gptcore.model.config import ModelConfig
from gptcore.runtime.config import DeviceDefaults
from tasks.params.schema import ModelProfile, PipelineParams

PARAMS_DIR = Path(__file__).resolve().parent.parent.parent / "params"
PROFILES_DIR = PARAMS_DIR / "profiles"
# A start model of an architecture no profile has runs as this profile, unless runtime.cpu / runtime.gpu
# say otherwise: small batches, for a size nothing here has measured (runtime.batch_size auto probes).
BASE_MODEL_PROFILE = "base-model"
BASE_MODEL_DEFAULTS = {
    "cpu": DeviceDefaults(batch_size=1, grad_accum_steps=8),
    "gpu": DeviceDefaults(batch_size=8, precision="bf16"),
}


DIAL_KEYS = ("model.depth", "model.recipe")  # the size dial's (gptcore.model.dial)


class ParamsLoader(yaml.SafeLoader):
    """Safe YAML that reads `1e-3` as a float, as YAML 1.2 does (PyYAML's 1.1 rules make it a string)."""


ParamsLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d[\d_]*)?(?:\.\d*)?[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def _describe_error(source: str, error: ValidationError) -> str:
    """The first validation error as one line: file, key path, value, what is allowed."""
    first = error.errors()[0]
    key = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if not key:  # a check across sections: its message names the keys
        return f"{source}: {message}"
    if first["type"] == "extra_forbidden":
        return f"{source}: {key}: unknown key"
    if first["type"] == "missing":
        return f"{source}: {key}: missing required key"
    if isinstance(first.get("input"), dict):  # a whole section: its message names the keys, not a dump
        return f"{source}: {key}: {message}"
    return f"{source}: {key}: value {first.get('input')!r} is not allowed: {message}"


def read_yaml(path: Path, what: str = "parameter file") -> dict[str, Any]:
    """A YAML mapping, loaded safely; every failure is a ConfigError naming the file. Any readable path
    will do (a pipe from the shell too); a missing one is refused as not found."""
    if not path.exists():
        raise ConfigError(f"{path}: {what} not found")
    if path.is_dir():
        raise ConfigError(f"{path}: the {what} is a folder; name a YAML file")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=ParamsLoader)
    except OSError as error:
        raise ConfigError(f"{path}: the {what} cannot be read ({error.strerror or error})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (it is not valid UTF-8)") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "malformed YAML"
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    if data is None:
        raise ConfigError(f"{path}: the {what} is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the {what} must be a mapping of keys, found {type(data).__name__}")
    return data


def load_profile(name_or_path: str, base: Path = PROFILES_DIR) -> ModelProfile:
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = base / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in base.glob("*.yaml")))
        raise ConfigError(f"model profile {name_or_path!r} not found (known profiles: {known})")
    data = read_yaml(path, "model profile")
    try:
        return ModelProfile.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe_error(str(path), error)) from None


def profile_of(architecture: ModelConfig, base: Path = PROFILES_DIR) -> ModelProfile:
    """The profile a start model of `architecture` runs as: the one in `base` of that architecture (its
    name and device defaults; the dropout `architecture`'s), else `BASE_MODEL_PROFILE`."""
    for path in sorted(base.glob("*.yaml")):
        profile = load_profile(str(path), base)
        if not profile.architecture.differences(architecture):
            return profile.model_copy(update={"architecture": architecture})
    return ModelProfile(name=BASE_MODEL_PROFILE, architecture=architecture, **BASE_MODEL_DEFAULTS)


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """`key.path=value`, the value read as YAML (so `3`, `1e-3`, `true`, `[a, b]` keep their types)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {assignment!r}: expected key.path=value")
    try:
        value = yaml.load(raw, Loader=ParamsLoader) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    node = data
    parts = key.strip().split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {assignment!r}: {part} is a value, not a section")
        node = child
    node[parts[-1]] = value


def load_params(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> PipelineParams:
    """Read, override and validate a parameter file; the model profile resolves beside `params/profiles`."""
    path = Path(path)
    data = read_yaml(path)
    profiles = path.resolve().parent / "profiles"
    profiles = profiles if profiles.is_dir() else PROFILES_DIR
    for assignment in overrides:
        if assignment.startswith("model.") and isinstance(data.get("model"), str):  # a key of the profile
            data["model"] = load_profile(data["model"], profiles).model_dump()
        if assignment.partition("=")[0].strip() in DIAL_KEYS and isinstance(data.get("model"), dict):
            data["model"].pop("name", None)  # another point on the dial: named by it, not the file's
        apply_override(data, assignment)
    source = f"{path}" + (" (with --set)" if overrides else "")
    profile_ref = data.get("model")
    if isinstance(profile_ref, str):
        data["model"] = load_profile(profile_ref, profiles)
    try:
        return PipelineParams.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe_error(source, error)) from None


def iteration_file(iteration: int) -> Path:
    path = PARAMS_DIR / f"iteration_{iteration}.yaml"
    if not path.is_file():
        numbers = (p.stem.removeprefix("iteration_") for p in PARAMS_DIR.glob("iteration_*.yaml"))
        known = ", ".join(sorted(n for n in numbers if n.isdigit()))  # not a variant: iteration_1_modern
        raise ConfigError(
            f"--iteration {iteration}: no parameter file {path.name} (known iterations: {known})"
        )
    return path


def choice(flag: str, value: str, allowed: Any) -> str:
    """`value` when it is one of `allowed` (a tuple, or a `Literal` type of the config), else a one-line
    error naming the flag, the value and what is allowed."""
    options = typing.get_args(allowed) or tuple(allowed)
    if value not in options:
        raise ConfigError(f"{flag} {value!r}: expected one of {', '.join(options)}")
    return value
