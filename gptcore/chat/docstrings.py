"""A chat corpus every machine has: conversations about the Python standard library built from its own
sources, with no hub and no network. For each public function and class of a public module:

- "What does `json.dumps` do?" answered by the first paragraph of its docstring;
- "Show the signature of `json.dumps`." answered by the signature as its source states it.

The sources are parsed (`ast`), never imported. The splits are by top-level package, drawn by a hash of
its name: every question about `json`, `json.decoder` included, lands in one split, so a model measured on
the test split was never fine-tuned on anything of those modules."""

from __future__ import annotations

import ast
import copy
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gptcore.chat.conversations import Conversation, write

SYSTEM = "You answer questions about the Python standard library."
SPLITS = ("train", "validation", "test")
MIN_ANSWER, MAX_ANSWER = 24, 600  # characters of a first paragraph worth asking about (shorter: a stub)
SKIPPED_PACKAGES = {"test", "idlelib", "lib2to3", "turtledemo", "tkinter", "ensurepip", "site-packages"}


@dataclass(frozen=True)
class Documented:
    """A public function or class of a module: its dotted name, its signature and its docstring."""

    name: str
    signature: str
    docstring: str

    def first_paragraph(self) -> str:
        paragraph = re.split(r"\n\s*\n", self.docstring.strip(), maxsplit=1)[0]
        return " ".join(paragraph.split())

    def conversations(self) -> Iterator[Conversation]:
        answer = self.first_paragraph()
        if MIN_ANSWER <= len(answer) <= MAX_ANSWER:
            yield Conversation.of(
                [("system", SYSTEM), ("user", f"What does `{self.name}` do?"), ("assistant", answer)]
            )
        yield Conversation.of(
            [("system", SYSTEM), ("user", f"Show the signature of `{self.name}`."),
             ("assistant", f"`{self.signature}`")]
        )  # fmt: skip


def module_name(root: Path, path: Path) -> str | None:
    """The dotted name of a stdlib source file (None: a private, test or non-package module)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if not parts or parts[0] in SKIPPED_PACKAGES or any(part.startswith("_") for part in parts):
        return None
    if not all(part.isidentifier() for part in parts):
        return None
    return ".".join(parts)


def documented(module: str, source: str) -> Iterator[Documented]:
    """The public functions and classes a module's source defines at its top level, with docstrings."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # a file for another Python version: nothing to ask about
        return
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        docstring = ast.get_docstring(node)
        if node.name.startswith("_") or not docstring:
            continue
        name = f"{module}.{node.name}"
        yield Documented(name, f"{name}({_arguments(node)})", docstring)


def _arguments(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> str:
    """A function's parameters as written (defaults and annotations included); a class's are its
    `__init__`'s without `self` (none written: empty)."""
    if not isinstance(node, ast.ClassDef):
        return ast.unparse(node.args)
    inits = [item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"]
    if not inits:
        return ""
    arguments = copy.copy(inits[0].args)  # shallow: the lists below are new, the nodes shared
    if arguments.posonlyargs:
        arguments.posonlyargs = arguments.posonlyargs[1:]
    else:
        arguments.args = arguments.args[1:]
    return ast.unparse(arguments)


def split_of(key: str, validation_fraction: float, test_fraction: float, seed: int = 1337) -> str:
    """The split of `key` (a module's top-level package; any text): drawn by a hash of the seed and the
    key, the same on every machine."""
    draw = int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "big") / 2**64
    if draw < test_fraction:
        return "test"
    return "validation" if draw < test_fraction + validation_fraction else "train"


def build(
    files: list[Path],
    root: Path,
    validation_fraction: float = 0.1,
    test_fraction: float = 0.1,
    seed: int = 1337,
) -> dict[str, list[Conversation]]:
    """The conversations of `files` (stdlib sources under `root`) by split, in the files' order."""
    splits: dict[str, list[Conversation]] = {split: [] for split in SPLITS}
    for path in sorted(files):
        module = module_name(root, path)
        if module is None:
            continue
        source = path.read_text(encoding="utf-8", errors="replace")
        split = splits[split_of(module.split(".")[0], validation_fraction, test_fraction, seed)]
        for item in documented(module, source):
            split.extend(item.conversations())
    return splits


def write_splits(splits: dict[str, list[Conversation]], folder: Path) -> dict[str, Path]:
    """Each split as `<split>.jsonl` in `folder`, each file written whole or not at all."""
    folder.mkdir(parents=True, exist_ok=True)
    return {split: write(conversations, folder / f"{split}.jsonl") for split, conversations in splits.items()}
