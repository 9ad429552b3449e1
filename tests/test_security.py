"""Security: nothing the project reads can run code, servers listen on loopback unless asked.

A static audit of the project's own sources (every `torch.load` with `weights_only=True`, YAML only
through safe loaders, no pickle, no Prefect result persisted as one, no wildcard bind addresses), and
the behaviour behind it: a YAML tag that would construct a Python object, a checkpoint that pickles
one and a stage's cached record swapped for a pickle are all refused.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gptcore.checkpoint import files as ckpt
from gptcore.checkpoint.record import CheckpointRecord
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


def test_no_flow_or_task_persists_its_result_as_a_pickle() -> None:
    """Prefect persists a result with pickle unless told otherwise: every flow and task says
    `persist_result=False`, but the stage tasks, whose records are gptpipe's plain JSON."""
    seen = 0
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            decorators = getattr(node, "decorator_list", [])
            bare = [d for d in decorators if isinstance(d, ast.Name) and d.id in ("flow", "task")]
            assert not bare, f"{path}:{node.lineno}: @{bare[0].id} without persist_result"
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("flow", "task")):
                continue
            seen += 1
            persist, serializer = keyword(node, "persist_result"), keyword(node, "result_serializer")
            as_json = isinstance(serializer, ast.Call) and getattr(serializer.func, "id", "") == "StageJSON"
            said = isinstance(persist, ast.Constant) and (persist.value is False or as_json)
            assert said, f"{path}:{node.lineno}: a {node.func.id} that may persist its result as a pickle"
    assert seen >= 7, "the audit sees the project's flows and tasks"


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
        tmp_path, "step-00000001", {"step": 1, "x": Payload()}, CheckpointRecord("step", 1)
    )
    with pytest.raises(
        CheckpointError, match=r"step-00000001.pt: checkpoint cannot be loaded \(UnpicklingError\)"
    ):
        ckpt.load_checkpoint(path)


# A tiny cached stage in a flow, run four times in one process. Before the second run every open of its
# record is watched: the first read gets the record as it was, and the file is then swapped for a pickle
# that leaves a marker when unpickled, so any second read (a check, then a read: a time-of-check/time-of-use
# gap) would get the pickle.
CACHED_STAGE = """
import base64, builtins, io, json, os, pickle, sys
from pathlib import Path
from prefect import flow
from tasks.caching import records_folder, run_cached, stage_task
from tasks.results import StageResult

work = Path(sys.argv[1])


@stage_task("probe", records_folder())
def probe(fingerprint: str) -> StageResult:
    with (work / "computed").open("a") as log:
        log.write("computed\\n")
    return StageResult(fingerprint=fingerprint)


@flow(persist_result=False)
def pipeline() -> str:
    return run_cached("probe", probe, StageResult, fingerprint="f00d").state


class RunsCode:
    def __reduce__(self):
        return Path.touch, (work / "ran-code-from-the-cache",)


def swap_after_first_read(record: Path, planted: bytes) -> None:
    real_open, watched = io.open, os.path.realpath(record)

    def open_then_swap(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and "r" in mode and os.path.realpath(file) == watched:
            io.open = builtins.open = real_open
            checked = record.read_bytes()
            record.write_bytes(planted)
            return io.BytesIO(checked) if "b" in mode else io.StringIO(checked.decode())
        return real_open(file, mode, *args, **kwargs)

    io.open = builtins.open = open_then_swap


states = [pipeline()]
[record] = Path(os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"]).glob("probe-*")
written = json.loads(record.read_text())
planted = {**written, "metadata": {**written["metadata"], "serializer": {"type": "pickle"}}}
planted["result"] = base64.encodebytes(pickle.dumps(RunsCode())).decode()
swap_after_first_read(record, json.dumps(planted).encode())
states += [pipeline(), pipeline(), pipeline()]
serializer = json.loads(record.read_text())["metadata"]["serializer"]
print(json.dumps({"states": states, "computed": (work / "computed").read_text().count("computed"),
                  "serializer": serializer}))
"""


def test_a_cached_record_swapped_for_a_pickle_after_its_check_is_never_unpickled(
    tmp_path: Path, prefect_env: dict[str, str]
) -> None:
    """The bytes checked are the bytes used: a record swapped for a pickle once gptpipe has read it never
    runs. The run uses what it read; the next ignores the pickle and computes the stage once more, and the
    one after that finds its plain JSON record again."""
    command = [sys.executable, "-c", CACHED_STAGE, str(tmp_path)]
    ran = subprocess.run(command, env=prefect_env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert not (tmp_path / "ran-code-from-the-cache").exists(), "a pickle from the cache ran code"
    assert ran.returncode == 0, ran.stderr[-3000:]
    outcome = json.loads(ran.stdout.strip().splitlines()[-1])
    assert outcome["states"] == ["completed", "cached", "completed", "cached"]
    assert outcome["computed"] == 2 and outcome["serializer"] == {"type": "gptpipe-stage-json"}
    assert ran.stderr.count("not gptpipe's plain JSON record; ignored, the stage runs again") == 1
