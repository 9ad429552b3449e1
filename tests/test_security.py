"""Security: nothing the project reads can run code, servers listen on loopback unless asked.

A static audit of the project's own sources (every `torch.load` with `weights_only=True`, YAML only
through safe loaders, no pickle, no wildcard bind addresses), and the behaviour behind it: a YAML
tag that would construct a Python object and a checkpoint that pickles one are both refused.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gptcore.checkpoint import files as ckpt
from gptcore.errors import CheckpointError, ConfigError
from tasks.params.loading import ParamsLoader, load_params

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(
    p for folder in ("gptcore", "tasks", "flows", "bench") for p in (ROOT / folder).rglob("*.py")
)
SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader", "ParamsLoader"}


def calls(name: str) -> Iterator[tuple[Path, ast.Call]]:
    """Every call of `module.function` (e.g. `torch.load`) in the project's sources."""
    module, function = name.split(".")
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == function
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == module
            ):
                yield path, node


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def test_every_torch_load_passes_weights_only_true() -> None:
    found = list(calls("torch.load"))
    assert found, "the audit sees the project's torch.load calls"
    for path, call in found:
        value = keyword(call, "weights_only")
        assert isinstance(value, ast.Constant) and value.value is True, f"{path}:{call.lineno}"


def test_yaml_is_read_only_through_safe_loaders() -> None:
    for path, call in calls("yaml.load"):
        loader = keyword(call, "Loader")
        name = loader.attr if isinstance(loader, ast.Attribute) else getattr(loader, "id", None)
        assert name in SAFE_YAML_LOADERS, f"{path}:{call.lineno}: yaml.load with Loader={name}"
    for unsafe in ("yaml.unsafe_load", "yaml.full_load", "yaml.load_all", "pickle.load", "pickle.loads"):
        assert not list(calls(unsafe)), f"{unsafe} in the sources"
    assert issubclass(ParamsLoader, yaml.SafeLoader)


def test_no_server_binds_every_interface_by_default() -> None:
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        assert "0.0.0.0" not in text and '"::"' not in text, f"{path} binds a wildcard address"


def test_the_mlflow_ui_command_binds_loopback_unless_asked() -> None:
    import inspect

    from flows.cli.tracking import server_command

    assert inspect.signature(server_command).parameters["host"].default == "127.0.0.1"


def test_a_yaml_tag_that_would_run_code_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "evil.yaml"
    path.write_text('iteration: !!python/object/apply:os.system ["touch pwned"]\n')
    with pytest.raises(ConfigError, match=r"evil.yaml: invalid YAML at line 1.*constructor"):
        load_params(path)
    assert not (tmp_path / "pwned").exists()


class Payload:
    """Stands for any object a malicious checkpoint would smuggle in through pickle."""


def test_a_checkpoint_that_pickles_an_object_is_refused(tmp_path: Path) -> None:
    path, _ = ckpt.save_checkpoint(
        tmp_path, "step-00000001", {"step": 1, "x": Payload()}, {"kind": "step", "step": 1}
    )
    with pytest.raises(
        CheckpointError, match=r"step-00000001.pt: checkpoint cannot be loaded \(UnpicklingError\)"
    ):
        ckpt.load_checkpoint(path)
