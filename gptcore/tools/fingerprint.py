"""Content fingerprints: what truly determines a stage's output, hashed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO

_CHUNK = 1 << 20


def sha256_file(path: str | Path) -> str:
    with open(path, "rb") as handle:
        return sha256_handle(handle)


def sha256_handle(handle: BinaryIO) -> str:
    """The sha256 of what an open file holds from where it stands to its end."""
    digest = hashlib.sha256()
    while chunk := handle.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace, so equal values hash equally."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def fingerprint(*parts: Any, length: int = 16) -> str:
    """A short stable hash of JSON-serialisable parts (upstream fingerprints, settings, code version)."""
    return sha256_bytes(canonical_json(list(parts)).encode())[:length]


def sources_digest(sources: Iterable[tuple[str, Path]]) -> str:
    """A code version: the hash of source files, each by the name it is known by and its content."""
    digest = hashlib.sha256()
    for name, path in sources:
        digest.update(name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def code_version_of(*modules: ModuleType) -> str:
    """Hash of the given modules' source: a stage's cache key changes only when its own code does."""
    return sources_digest((module.__name__, Path(module.__file__ or "")) for module in modules)


@cache
def code_version() -> str:
    """Hash of gptcore's own source: any change to the code that makes outputs invalidates caches."""
    package = Path(__file__).parents[1]  # gptcore/, every subpackage of it
    sources = sorted(package.rglob("*.py"))
    return sources_digest((source.relative_to(package).as_posix(), source) for source in sources)
