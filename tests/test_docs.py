"""The docs name only what exists: README.md and docs/*.md are read for gptpipe commands and their flags,
parameter-file keys, make targets, Python module paths and repo files, and each is checked against the
source of truth (the Typer app, the pydantic schema, the Makefile, the tree). Every checker takes a doc's
name and text, so a planted mistake proves it reports what it should."""

from __future__ import annotations

import ast
import importlib
import re
import shlex
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = ("gptcore", "tasks", "flows")
# Code blocks whose lines are shell commands (an unlabeled block may be a diagram: only its lines that
# start with a command count, so prose in it is never read as one).
SHELL_LANGS = {"", "bash", "sh", "shell", "console", "text"}
# Endings that make a dotted word a file name, not a key or a module path.
FILE_ENDINGS = {
    "py", "yaml", "yml", "md", "json", "jsonl", "toml", "txt", "pt", "bin", "safetensors", "db", "lock",
    "env", "log", "sh", "cfg", "ini", "csv", "html", "example", "sql", "whl",
}  # fmt: skip
# Folders and files made at run time (or by the user from a template): their paths are examples.
RUN_TIME = ("data/", "checkpoints/", "mlruns/", ".venv/", ".prefect/", "servers/", "deploy/secrets.env")
PLANNED = "_planned.yaml"  # the parameter file `gptpipe scale` writes beside the one it read
GLOBAL_FLAGS = {"--verbose", "--help"}


@dataclass(frozen=True)
class Snippet:
    """A piece of code a doc shows: an inline span, or one logical line of a fenced block."""

    line: int
    text: str
    lang: str | None  # the fenced block's language; None for an inline span


# ---------------------------------------------------------------------------------------------- markdown


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def split_markdown(text: str) -> tuple[str, list[Snippet]]:
    """The prose (fenced blocks blanked, so offsets keep their line numbers) and the blocks' logical lines
    (a `\\` at a line's end continues it: the snippet carries the first line's number)."""
    prose: list[str] = []
    blocks: list[Snippet] = []
    fence: str | None = None
    lang = ""
    pending: tuple[int, str] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if fence is None:
            opening = re.match(r"(`{3,}|~{3,})\s*([\w+-]*)", stripped)
            if opening:
                fence, lang = opening[1], opening[2].lower()
                prose.append("")
            else:
                prose.append(line)
            continue
        prose.append("")
        if stripped.startswith(fence) and not stripped.strip(fence[0]):
            fence = None
            continue
        start, body = pending if pending else (number, "")
        body += line.rstrip()
        if body.endswith("\\"):
            pending = (start, body[:-1] + " ")
            continue
        pending = None
        blocks.append(Snippet(start, body, lang))
    return "\n".join(prose), blocks


# What a change note says of a name that is gone: "`bench/x.py` became `bench/y.py`", "moved to",
# "since replaced". The name is history there, not a claim that it exists.
GONE = re.compile(
    r"[^.|]{0,40}?\b(?:became|(?:moved|renamed) to|(?:removed|replaced|deleted) since|since "
    r"(?:removed|replaced|deleted)|replaced by|(?:was|were) (?:removed|deleted|replaced))\b"
)


def inline_spans(prose: str) -> list[Snippet]:
    """Inline code: single backticks, within a paragraph (a span may wrap onto the next line); spans a
    change note says are gone are left out."""
    spans = []
    for match in re.finditer(r"(?<!`)`((?:[^`\n]|\n(?![ \t]*\n))+)`(?!`)", prose):
        if not GONE.match(prose, match.end()):
            spans.append(Snippet(_line_of(prose, match.start()), " ".join(match[1].split()), None))
    return spans


def snippets(text: str) -> list[Snippet]:
    prose, blocks = split_markdown(text)
    return inline_spans(prose) + blocks


def _shell_words(command: str) -> list[str]:
    """A command line's words, comments dropped and `&&`, `;` kept as words of their own (`|` only
    between spaces: `auto|cpu` is a synopsis's choice)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&")
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote: plain words are close enough
        return command.split("#", 1)[0].split()


def shell_commands(snippet: Snippet) -> Iterator[list[str]]:
    """The commands a snippet runs, each as its words from the program on: a whole inline span, or each
    command of a shell block's line (`$ ` prompts and `VAR=value` prefixes dropped)."""
    if snippet.lang is not None and snippet.lang not in SHELL_LANGS:
        return
    text = snippet.text.strip().removeprefix("$ ")
    if snippet.lang is not None and not re.match(r"[\w.~/$-]", text):  # a diagram's or an output's line
        return
    command: list[str] = []
    words = [*_shell_words(text), ";"]
    for word, following in zip(words, [*words[1:], ""], strict=True):
        # `[--iteration N | --params FILE]`: a synopsis's alternatives, not a pipe
        if (word and set(word) <= set(";&")) or (word in {"|", "||"} and not following.startswith("-")):
            if command:
                yield command
            command = []
        elif command or not re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", word):
            command.append(word)


def program(words: list[str]) -> str:
    return words[0].rsplit("/", 1)[-1] if words else ""


# ------------------------------------------------------------------------------------ gptpipe commands


@cache
def cli() -> Any:
    """The click group behind `gptpipe`, every command registered (`_register_commands` fills the app)."""
    from flows.cli.main import _register_commands, app

    _register_commands()
    return typer.main.get_command(app)


def _flags(command: Any) -> set[str]:
    # Typer may run on its vendored click: options are told apart by their kind, not their class.
    return {
        flag
        for param in command.params
        if getattr(param, "param_type_name", "") == "option"
        for flag in (*param.opts, *param.secondary_opts)
    } | {"--help"}


def check_commands(doc: str, text: str) -> list[str]:
    """Every `gptpipe COMMAND [SUBCOMMAND] ... --flag` names a command and flags it takes."""
    group = cli()
    problems = []
    for snippet in snippets(text):
        for words in shell_commands(snippet):
            if program(words) != "gptpipe":
                continue
            where = f"{doc}:{snippet.line}"
            command, path = group, ["gptpipe"]
            for word in words[1:]:
                option = re.match(r"[\[(]*(--[\w-]+)", word)  # `[--json]`: a synopsis's optional flag
                if option:
                    flag = option[1]
                    allowed = _flags(command) | (GLOBAL_FLAGS if command is group else set())
                    if flag not in allowed:
                        problems.append(f"{where}: `{' '.join(path)}` has no option {flag}")
                    continue
                if not hasattr(command, "commands"):
                    continue
                if not re.fullmatch(r"[a-z][a-z0-9-]*", word):  # `...`, a placeholder: no command named
                    break
                if word not in command.commands:
                    problems.append(f"{where}: `{' '.join(path)}` has no command {word!r}")
                    break
                command, path = command.commands[word], [*path, word]
    return problems


# ------------------------------------------------------------------------------------- parameter keys


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (Optional, unions, list items)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models(arg)]


def _is_open(annotation: Any) -> bool:
    """Whether keys below a field are free: a dict, or Any."""
    if annotation is Any or typing.get_origin(annotation) is dict or annotation is dict:
        return True
    return any(_is_open(arg) for arg in typing.get_args(annotation))


def key_error(parts: list[str], model: type[BaseModel]) -> str | None:
    """None when the dotted key resolves in `model`, else what is missing."""
    for index, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return f"no key {part!r} in {'.'.join(parts[:index]) or 'the file'} ({model.__name__})"
        rest = parts[index + 1 :]
        if not rest or _is_open(field.annotation):
            return None
        models = [m for m in _models(field.annotation) if rest[0] in m.model_fields]
        if not models:
            below = _models(field.annotation)
            if not below:
                return f"{'.'.join(parts[: index + 1])} is a value, not a section"
            return f"no key {rest[0]!r} in {'.'.join(parts[: index + 1])} ({below[0].__name__})"
        model = models[0]
    return None


@cache
def schemas() -> dict[str, type[BaseModel]]:
    """The top-level sections: the parameter file's, and a model profile's (params/profiles/*.yaml)."""
    from tasks.params.schema import ModelProfile, PipelineParams

    return {name: PipelineParams for name in PipelineParams.model_fields} | {
        name: ModelProfile for name in ModelProfile.model_fields
    }


@cache
def recorded_names() -> frozenset[str]:
    """Dotted names the runs record that share a section's prefix: the profile's `model.*` params and the
    string constants of the code (`tracking.failed_calls`, a tag). Docs may name these as they are."""
    from tasks.params.loading import PROFILES_DIR, load_profile

    names = set(load_profile("gpt_first_cpu", PROFILES_DIR).as_params())
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            names.update(re.findall(r"[\"']([a-z_]+(?:\.[a-z_]+)+)[\"']", path.read_text(encoding="utf-8")))
    return frozenset(names)


@cache
def type_names() -> dict[str, list[str]]:
    """Names of the sections' types that are no section (`training`: TrainingConfig, the type of `smoke`
    and `full`): a key written under one is an old or a wrong section name, never a relative key."""
    from tasks.params.schema import PipelineParams

    sections: dict[str, list[str]] = {}
    for section, field in PipelineParams.model_fields.items():
        for model in _models(field.annotation):
            for base in model.__mro__:
                stem = base.__name__.removesuffix("Config").removesuffix("Section").lower()
                if base.__name__.endswith("Config") and stem not in schemas():
                    sections.setdefault(stem, []).append(section)
    return sections


def check_key(key: str, explicit: bool = False) -> str | None:
    """What is wrong with a dotted key, None when nothing is or it is no parameter key at all.
    `explicit`: given to --set or --grid, so surely a key of the parameter file."""
    from tasks.params.schema import PipelineParams

    parts = key.split(".")
    if explicit:  # `--set key=value`, `KEY.PATH=...`: a synopsis's placeholder
        return None if parts[0] in {"key", "KEY"} else key_error(parts, PipelineParams)
    if len(parts) < 2 or parts[-1] in FILE_ENDINGS or key in recorded_names():
        return None
    if parts[0] in type_names():
        homes = [f"{s}.{'.'.join(parts[1:])}" for s in type_names()[parts[0]]]
        homes = [home for home in homes if key_error(home.split("."), PipelineParams) is None]
        return f"no section {parts[0]!r}" + (f" (the key is {' or '.join(homes)})" if homes else "")
    model = schemas().get(parts[0])
    return key_error(parts, model) if model else None


def _yaml_key_paths(data: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """A YAML fragment's key paths; a list's items (`evaluate.benchmarks`) have their keys under it."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield (*prefix, str(key))
            yield from _yaml_key_paths(value, (*prefix, str(key)))
    elif isinstance(data, list):
        for item in data:
            yield from _yaml_key_paths(item, prefix)


SET_KEY = re.compile(r"--(?:set|grid)[\s=]['\"]?([A-Za-z_][\w.]*)=")


def check_keys(doc: str, text: str) -> list[str]:
    """Every parameter key named (inline, after --set/--grid, in a YAML block) is in the schema."""
    from tasks.params.schema import PipelineParams

    problems = []
    for snippet in snippets(text):
        found: list[tuple[str, bool]] = []
        if snippet.lang is None:
            leading = re.match(r"([A-Za-z_]\w*(?:\.\w+)+)(?=$|[\s:=\[|,)])", snippet.text)
            if leading and not snippet.text.startswith(PACKAGES):
                found.append((leading[1], False))
        found += [(key, True) for key in SET_KEY.findall(snippet.text)]
        for key, explicit in found:
            error = check_key(key, explicit)
            if error:
                problems.append(f"{doc}:{snippet.line}: `{key}`: {error}")
    for line, block in yaml_blocks(text):
        if isinstance(block, yaml.YAMLError):  # a reader copying it gets the same error
            problems.append(f"{doc}:{line}: a YAML block that does not parse: {_yaml_problem(block)}")
            continue
        if not isinstance(block, dict) or not set(block) <= set(schemas()):
            continue  # not a parameter file's or a profile's fragment
        model = schemas()[next(iter(block))] if block else PipelineParams
        for path in _yaml_key_paths(block):
            error = key_error(list(path), model)
            if error:
                problems.append(f"{doc}:{line}: `{'.'.join(path)}` (YAML): {error}")
    return problems


def yaml_blocks(text: str) -> list[tuple[int, Any]]:
    """Each ```yaml block's first line and its data, or the error a block that does not parse raises."""
    blocks = []
    for match in re.finditer(r"^[ \t]*```ya?ml[ \t]*\n(.*?)^[ \t]*```", text, re.M | re.S):
        try:
            data = yaml.safe_load(match[1])
        except yaml.YAMLError as error:
            data = error
        blocks.append((_line_of(text, match.start()) + 1, data))
    return blocks


def _yaml_problem(error: yaml.YAMLError) -> str:
    """What a YAML error says, and on which line of its block (counted from 1)."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        return f"{error.problem} (its line {error.problem_mark.line + 1})"
    return str(error).splitlines()[0]


# -------------------------------------------------------------------------------------------- make


def rule_targets(makefile: str) -> frozenset[str]:
    """Targets with a rule (`target: ...` outside a recipe); a .PHONY listing alone is none."""
    targets = set()
    for line in makefile.splitlines():
        rule = re.match(r"([^\s#:=][^:=]*?)\s*::?(?!=)", line)
        if rule:
            targets.update(rule[1].split())
    return frozenset(targets - {".PHONY"})


@cache
def make_targets() -> frozenset[str]:
    return rule_targets((ROOT / "Makefile").read_text(encoding="utf-8"))


def check_make(doc: str, text: str) -> list[str]:
    """Every `make TARGET` names a target the Makefile has a rule for."""
    problems = []
    for snippet in snippets(text):
        for words in shell_commands(snippet):
            if program(words) != "make":
                continue
            for word in words[1:]:
                if word.startswith("-") or "=" in word:
                    continue
                if word not in make_targets():
                    problems.append(f"{doc}:{snippet.line}: `make {word}`: no rule in the Makefile")
    return problems


# -------------------------------------------------------------------------------------------- modules


def _defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module's or a class's body binds, those under `if`, `try` and `with` included."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update((n.id, node) for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update(((alias.asname or alias.name).split(".")[0], node) for alias in node.names)
        elif isinstance(node, ast.If | ast.Try | ast.With):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt | ast.excepthandler):
                    names.update(_defined(child.body if isinstance(child, ast.excepthandler) else [child]))
    return names


def _imported_attribute(module: str, attributes: list[str]) -> bool:
    """The slow way, for what the source alone does not show (an inherited or re-exported name)."""
    try:
        value: Any = importlib.import_module(module)
        for attribute in attributes:
            fields = getattr(value, "model_fields", {})
            value = fields[attribute] if attribute in fields else getattr(value, attribute)
    except Exception:
        return False
    return True


def module_error(dotted: str) -> str | None:
    """None when the longest module prefix is a file (or package) of the repo and the rest its
    attributes."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:end])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if base.with_suffix(".py").is_file() or base.is_dir():
            break
    else:
        return f"no module {parts[0]}"
    module, rest = ".".join(parts[:end]), parts[end:]
    if not rest:
        return None
    body = ast.parse(source.read_text(encoding="utf-8")).body if source.is_file() else []
    for index, part in enumerate(rest):
        node = _defined(body).get(part)
        if node is None or (not isinstance(node, ast.ClassDef) and index < len(rest) - 1):
            if _imported_attribute(module, rest):
                return None
            return f"module {module} ({source.relative_to(ROOT)}) has no {'.'.join(rest[: index + 1])}"
        body = node.body if isinstance(node, ast.ClassDef) else []
    return None


MODULE_PATH = re.compile(r"(?<![\w./-])((?:gptcore|tasks|flows)(?:\.[A-Za-z_]\w*)+)")
FROM_IMPORT = re.compile(r"from\s+((?:gptcore|tasks|flows)[\w.]*)\s+import\s+(\w+(?:\s*,\s*\w+)*)")


def check_modules(doc: str, text: str) -> list[str]:
    """Every dotted path into gptcore, tasks or flows names a module of the repo and its attributes;
    `from MODULE import NAME` in a Python block names MODULE.NAME."""
    problems = []
    for snippet in snippets(text):
        paths = [m for m in MODULE_PATH.findall(snippet.text) if m.rsplit(".", 1)[-1] not in FILE_ENDINGS]
        for module, names in FROM_IMPORT.findall(snippet.text):
            paths += [f"{module}.{name.strip()}" for name in names.split(",") if name.strip()]
        for path in dict.fromkeys(paths):
            error = module_error(path)
            if error:
                problems.append(f"{doc}:{snippet.line}: `{path}`: {error}")
    return problems


# ---------------------------------------------------------------------------------------------- files


@cache
def top_level() -> frozenset[str]:
    """The repo's top-level folders and files: a path is the repo's only when it starts with one."""
    return frozenset(p.name for p in ROOT.iterdir() if not p.name.startswith("."))


def _is_example(path: str) -> bool:
    """Paths that stand for others: made at run time, placeholders, globs, URLs."""
    return (
        path.startswith(RUN_TIME)
        or path.endswith(PLANNED)
        or "://" in path
        or any(mark in path for mark in ("*", "<", ">", "...", "…", "{", "$"))
        or re.search(r"(?:^|[_\-/.])(?:N|[A-Z]{2,})(?:$|[_\-/.])", path) is not None
    )


def _heading_anchors(text: str) -> set[str]:
    """GitHub's anchors of a doc's headings: lowercased, punctuation dropped, spaces to dashes."""
    anchors: set[str] = set()
    prose, _ = split_markdown(text)
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", prose, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchor, count = slug, 1
        while anchor in anchors:
            anchor, count = f"{slug}-{count}", count + 1
        anchors.add(anchor)
    return anchors


def _file_error(path: str) -> str | None:
    """None when a repo path exists (and `file.py:name` defines name)."""
    path, _, name = path.partition(":")
    name = re.match(r"\w*", name)[0]  # type: ignore[index]
    target = ROOT / path
    if not target.exists():
        return "no such file or folder"
    if path.endswith("/") and not target.is_dir():
        return "not a folder"
    if name and target.suffix == ".py":
        module = ".".join(Path(path).with_suffix("").parts)
        return module_error(f"{module}.{name}")
    return None


def _repo_paths(words: list[str]) -> Iterator[str]:
    for word in words:
        word = word.strip("\"'`,;:()[]").rstrip(".")
        if "/" in word and word.split("/", 1)[0] in top_level() and not _is_example(word):
            yield word


def check_files(doc: str, text: str) -> list[str]:
    """Every repo path a doc names in code or a link exists; a link's #anchor is a heading of its doc."""
    problems = []
    for snippet in snippets(text):
        if snippet.lang is not None and snippet.lang not in SHELL_LANGS:
            continue
        for path in dict.fromkeys(_repo_paths(snippet.text.split())):
            error = _file_error(path)
            if error:
                problems.append(f"{doc}:{snippet.line}: `{path}`: {error}")
    prose, _ = split_markdown(text)
    folder = (ROOT / doc).parent
    for match in re.finditer(r"\]\(([^)\s]+)\)", prose):
        target = match[1]
        if re.match(r"[a-z]+:", target):  # a URL, a mailto
            continue
        where = f"{doc}:{_line_of(prose, match.start())}"
        file, _, anchor = target.partition("#")
        linked = (folder / file).resolve() if file else ROOT / doc
        if file and not linked.exists():
            problems.append(f"{where}: link ({target}): no such file")
        elif anchor and linked.suffix == ".md":
            linked_text = text if not file else linked.read_text(encoding="utf-8")
            if anchor not in _heading_anchors(linked_text):
                problems.append(f"{where}: link ({target}): no heading #{anchor} in {linked.name}")
    return problems


# ----------------------------------------------------------------------------------------------- tests


def _doc_problems(check: Callable[[str, str], list[str]]) -> list[str]:
    return [p for doc in DOCS for p in check(str(doc.relative_to(ROOT)), doc.read_text(encoding="utf-8"))]


def _assert_none(problems: list[str], what: str) -> None:
    assert not problems, f"{len(problems)} {what} the docs name that do not exist:\n" + "\n".join(problems)


def test_every_gptpipe_command_and_flag_the_docs_name_exists() -> None:
    _assert_none(_doc_problems(check_commands), "gptpipe commands or flags")


def test_every_parameter_key_the_docs_name_is_in_the_schema() -> None:
    _assert_none(_doc_problems(check_keys), "parameter keys")


def test_every_make_target_the_docs_name_has_a_rule() -> None:
    _assert_none(_doc_problems(check_make), "make targets")


def test_every_module_path_the_docs_name_exists() -> None:
    _assert_none(_doc_problems(check_modules), "module paths")


def test_every_file_the_docs_name_exists() -> None:
    _assert_none(_doc_problems(check_files), "files")


PLANTED = """# Planted

Run `gptpipe run --iteration 2 --no-such-flag` or `gptpipe tracking replay --no-replay-flag`, with
`full.no_such_key` and `full.max_steps`, and `--set smoke.max_stepz=3`; see `bench/no_such.py`,
`bench/recipes.py` and `gptcore.train.no_such_module.x`; then `make no-such-target`.

```bash
gptpipe train --iteration 1 \\
    --device cpu --no-such-train-flag   # a comment --not-a-flag
gptpipe no-such-command
```

```yaml
full:
  max_stepz: 3
```

[there](missing.md) and [here](#no-such-heading) and [fine](#planted).

```yaml
full:
  max_steps: 3
 eval_every: 2
```
"""


@pytest.mark.parametrize(
    ("check", "expected"),
    [
        (
            check_commands,
            [
                "docs/planted.md:3: `gptpipe run` has no option --no-such-flag",
                "docs/planted.md:3: `gptpipe tracking replay` has no option --no-replay-flag",
                "docs/planted.md:8: `gptpipe train` has no option --no-such-train-flag",
                "docs/planted.md:10: `gptpipe` has no command 'no-such-command'",
            ],
        ),
        (
            check_keys,
            [
                "docs/planted.md:4: `full.no_such_key`: no key 'no_such_key' in full (FullTrainingConfig)",
                "docs/planted.md:4: `smoke.max_stepz`: no key 'max_stepz' in smoke (SmokeConfig)",
                "docs/planted.md:14: `full.max_stepz` (YAML): no key 'max_stepz' in full "
                "(FullTrainingConfig)",
                "docs/planted.md:21: a YAML block that does not parse: expected <block end>, but found "
                "'<block mapping start>' (its line 3)",
            ],
        ),
        (check_make, ["docs/planted.md:5: `make no-such-target`: no rule in the Makefile"]),
        (
            check_modules,
            [
                "docs/planted.md:5: `gptcore.train.no_such_module.x`: module gptcore.train "
                "(gptcore/train/__init__.py) has no no_such_module"
            ],
        ),
        (
            check_files,
            [
                "docs/planted.md:4: `bench/no_such.py`: no such file or folder",
                "docs/planted.md:18: link (missing.md): no such file",
                "docs/planted.md:18: link (#no-such-heading): no heading #no-such-heading in planted.md",
            ],
        ),
    ],
)
def test_the_checks_report_a_planted_mistake_and_only_it(
    check: Callable[[str, str], list[str]], expected: list[str]
) -> None:
    assert check("docs/planted.md", PLANTED) == expected


def test_a_phony_listing_alone_is_no_make_rule() -> None:
    makefile = ".PHONY: run bench\nVENV ?= .venv\nPY := $(VENV)/bin/python\n\nrun: setup\n\t$(PY) -m x\n"
    assert rule_targets(makefile) == {"run"}
