"""The shape of the tree, read from the sources: the layers import one way (gptcore knows neither
Prefect nor MLflow; tasks know no flow), gptcore's rooms import one way, no module imports itself
back through others, and nothing grows past the sizes a reader can hold."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gptcore", "tasks", "flows")
MAX_CLASS_LINES = 250
MAX_FUNCTION_LINES = 80
# gptcore's top level: the package, its errors, generation, and the old name of the model files that
# logged models load through (gptcore/model_files.py). Its configurations live in its rooms.
GPTCORE_TOP = {"__init__", "errors", "generate", "model_files"}
SCHEMA = ROOT / "tasks" / "params" / "schema.py"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES = {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def imported(path: Path) -> Iterator[str]:
    """Every module `path` imports, at the top or inside a function (`from a import b`: `a.b` when
    that is a module, else `a`)."""
    return imported_in(ast.parse(path.read_text(encoding="utf-8")))


def imported_in(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield full if full in SOURCES else node.module


def import_graph() -> dict[str, set[str]]:
    return {
        name: {target for target in imported(path) if target in SOURCES and target != name}
        for name, path in SOURCES.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def room(module: str) -> str:
    """`gptcore.train.trainer` -> `gptcore.train`; a top-level module is its own room."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_module_imports_itself_back_through_others() -> None:
    assert circles(import_graph()) == []


def test_gptcore_rooms_import_one_way() -> None:
    rooms: dict[str, set[str]] = {}
    for name, targets in import_graph().items():
        if name.startswith("gptcore."):
            rooms.setdefault(room(name), set()).update(
                room(t) for t in targets if t.startswith("gptcore.") and room(t) != room(name)
            )
    assert circles(rooms) == []


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [("gptcore", ("prefect", "mlflow", "tasks", "flows")), ("tasks", ("flows",))],
)
def test_a_layer_imports_nothing_above_it(layer: str, forbidden: tuple[str, ...]) -> None:
    upward = [
        f"{name} imports {target}"
        for name, path in SOURCES.items()
        if name.startswith(f"{layer}.") or name == layer
        for target in imported(path)
        if target.split(".")[0] in forbidden
    ]
    assert upward == []


def test_gptcore_top_level_holds_a_handful_of_modules() -> None:
    top = {path.stem for path in (ROOT / "gptcore").glob("*.py")}
    assert top <= GPTCORE_TOP


def test_no_class_or_function_outgrows_a_reader() -> None:
    too_long = []
    for name, path in SOURCES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            limit = {
                ast.ClassDef: MAX_CLASS_LINES,
                ast.FunctionDef: MAX_FUNCTION_LINES,
                ast.AsyncFunctionDef: MAX_FUNCTION_LINES,
            }.get(type(node))
            if limit and node.end_lineno - node.lineno + 1 > limit:
                too_long.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert too_long == []


def test_a_flow_imports_no_command_line_module() -> None:
    flows = {name: path for name, path in SOURCES.items() if name.startswith("flows.")}
    upward = [
        f"{name} imports {target}"
        for name, path in flows.items()
        if not name.startswith("flows.cli")
        for target in imported(path)
        if target.startswith("flows.cli")
    ]
    assert upward == []


def mlflow_reached_directly(name: str, source: str) -> list[str]:
    """Where a module reaches MLflow itself: imports it (at the top, in a function, or by `import_module`),
    reads some object's `.client` (a tracking session's MlflowClient), names `MlflowClient`, or takes a
    bare client from `tasks.tracking.store.connect`."""
    tree = ast.parse(source)
    found = [f"{name} imports {target}" for target in imported_in(tree) if target.split(".")[0] == "mlflow"]
    for node in ast.walk(tree):
        at = f"{name}:{getattr(node, 'lineno', '')}"
        if isinstance(node, ast.Attribute) and node.attr == "client":
            found.append(f"{at} reads .client")
        if isinstance(node, ast.Name) and node.id == "MlflowClient":
            found.append(f"{at} names MlflowClient")
        if isinstance(node, ast.ImportFrom) and node.module == "tasks.tracking.store":
            found += [f"{at} imports store.connect" for alias in node.names if alias.name == "connect"]
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
            "import_module",
            "__import__",
        ):
            named = [arg.value for arg in node.args[:1] if isinstance(arg, ast.Constant)]
            found += [f"{at} imports {value}" for value in named if str(value).split(".")[0] == "mlflow"]
    return found


def test_flows_reach_mlflow_only_through_tasks_tracking() -> None:
    """Everything a flow or a command asks of MLflow (parent runs, searches, the registry, logged models,
    tags, artifacts) goes through the typed functions and classes of tasks/tracking (`ParentRun`,
    `run_search`, the registry's): flows/ never holds an MLflow client of its own."""
    found = [
        place
        for name, path in SOURCES.items()
        if name.startswith("flows")
        for place in mlflow_reached_directly(name, path.read_text(encoding="utf-8"))
    ]
    assert found == []


def test_gptcore_errors_name_no_upper_layer_not_even_in_a_string() -> None:
    text = (ROOT / "gptcore" / "errors.py").read_text(encoding="utf-8")
    assert re.findall(r"\b(?:tasks|flows|prefect|mlflow)\b", text, re.IGNORECASE) == []


def test_no_name_stands_for_a_class_as_any() -> None:
    """`Trainer = Any` hid an import the graph above cannot see: a class a module reads is imported, or
    described by a Protocol of what is read."""
    aliases = [
        f"{name}: {target.id} = Any"
        for name, path in SOURCES.items()
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id == "Any"
        for target in node.targets
        if isinstance(target, ast.Name)
    ]
    assert aliases == []


# gptcore's rooms, lowest first (docs/architecture.md's table): a room imports only rooms before it.
ROOMS = [
    "gptcore.tools", "gptcore.model", "gptcore.distributed", "gptcore.runtime", "gptcore.data",
    "gptcore.chat", "gptcore.export", "gptcore.finetune", "gptcore.checkpoint", "gptcore.train",
    "gptcore.eval",
]  # fmt: skip


def test_a_room_names_no_module_above_it_in_a_string() -> None:
    """A module named in a string (`python -m <module>`) is an import the graph cannot see: no room
    names a module of a room above it even there."""
    upward = [
        f"{name} names {node.value!r}"
        for name, path in SOURCES.items()
        if room(name) in ROOMS
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and node.value in SOURCES and room(node.value) in ROOMS
        if ROOMS.index(room(node.value)) > ROOMS.index(room(name))
    ]
    assert upward == []


def _schema_names() -> set[str]:
    """What the parameter file's schema defines: its sections' classes and its stage lists."""
    tree = ast.parse(SCHEMA.read_text(encoding="utf-8"))
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    assigned = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return classes | assigned


def test_gptcore_knows_nothing_of_the_parameter_file() -> None:
    """The parameter file's schema is the pipeline's: gptcore names none of it, and no function of
    gptcore takes `params` (the pipeline's name for a parameter file) to read sections from."""
    schema = _schema_names()
    assert {"PipelineParams", "STAGES", "SmokeConfig", "SweepConfig"} <= schema  # the check sees them
    found = []
    for name, path in SOURCES.items():
        if not name.startswith("gptcore"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name) and node.id in schema:
                found.append(f"{name} names {node.id}")
            if isinstance(node, ast.arg) and node.arg == "params":
                found.append(f"{name} takes params")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "params/" in node.value:
                found.append(f"{name} names the params/ folder")
    assert found == []


def _configurations() -> list[type]:
    from gptcore.tools.strict import Strict

    for name in SOURCES:
        if name.endswith(".config") or name.startswith("tasks.params"):
            __import__(name)
    seen, todo = [], [Strict]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen.append(sub)
                todo.append(sub)
    return seen


def test_every_configuration_field_says_what_it_is() -> None:
    """Every field of gptcore's configurations and of the parameter file has a description (litgpt's
    args.py): `--help` and the docs read them, and a reader never guesses."""
    configurations = _configurations()
    assert {cls.__name__ for cls in configurations} >= {"ModelConfig", "RuntimeConfig", "PipelineParams"}
    undocumented = [
        f"{cls.__module__}.{cls.__name__}.{field}"
        for cls in configurations
        for field, info in cls.model_fields.items()
        if not info.description
    ]
    assert undocumented == []


def test_no_module_runs_python_code_written_in_a_string() -> None:
    """`python -c "from flows.cli.main import main"` is an import the graph cannot see: a process of
    gptpipe is started as the installed `gptpipe` program or as a module a room may name."""
    hidden = [
        f"{name}: {node.value[:60]!r}"
        for name, path in SOURCES.items()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if re.search(r"\b(?:from|import)\s+(?:gptcore|tasks|flows)\b", node.value)
    ]
    assert hidden == []


def test_the_repository_paths_modules_find_from_their_own_place_exist() -> None:
    """A module that finds the repository from its own file (`Path(__file__).parents[N]`) breaks without
    a word when it moves to another folder: each such path is where it should be."""
    from flows.environment.prefect_settings import PREFECT_TOML, project_settings
    from tasks.params.loading import PARAMS_DIR, PROFILES_DIR

    assert PREFECT_TOML == ROOT / "prefect.toml" and PREFECT_TOML.is_file()
    assert project_settings()["PREFECT_HOME"] == str(ROOT / ".prefect")
    assert PARAMS_DIR == ROOT / "params" and PROFILES_DIR.is_dir()
    found = [
        f"{name}: {node.value!r}"
        for name, path in SOURCES.items()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and node.value == "pyproject.toml"
    ]
    assert found == ["flows.cli.dependencies: 'pyproject.toml'"]  # parents[2] of flows/cli/: the root


def calls_of(names: set[str]) -> dict[str, set[str]]:
    """Which modules call each of the functions `names` (by the name they are called as)."""
    found: dict[str, set[str]] = {name: set() for name in names}
    for module, path in SOURCES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                called = (
                    node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                )
                if called in names:
                    found[called].add(module)
    return found


def test_lora_is_put_on_by_one_call_and_merged_by_one_step() -> None:
    """The LoRA variant is made where a fine-tune starts (and checked, weightless, before it does); its
    adapters are folded into the weights by the merge step alone, never by a reader of checkpoints."""
    calls = calls_of({"apply_lora", "merge_lora"})
    assert calls["apply_lora"] == {"gptcore.finetune.start", "gptcore.finetune.lora"}  # merge: start.adapt
    assert calls["merge_lora"] == {"gptcore.checkpoint.merge"}


def test_a_stage_is_one_object_in_one_module_and_no_one_lists_the_code_it_hashes() -> None:
    """Each module of tasks/stages/ holds at most one stage (a class naming its `result_type`); the
    modules a stage's key hashes are derived from its imports (`tasks.stage.code_reached`), never listed
    by hand."""
    stages: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tasks" / "stages").glob("*.py")):
        tree = ast.parse(path.read_text())
        stages[path.stem] = [
            node.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef) and "result_type = " in ast.unparse(node)
        ]
    assert all(len(found) <= 1 for found in stages.values()), stages
    assert sum(len(found) for found in stages.values()) == 12  # every stage of both flows
    listed = [path for path in (ROOT / "tasks").rglob("*.py") if "code_version_of(" in path.read_text()]
    assert listed == []
