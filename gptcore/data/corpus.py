"""Corpus sources: the standard library, local files of any total size, or a hub dataset, as units.

A `Corpus` never holds the documents. It names the source, its fingerprint and how to cut it into
units (`gptcore.data.documents`): local files are planned up front (sizes and parquet footers only), a
hub dataset's units come as its rows are read, streamed when `corpus.streaming` is set. Each document
goes to train, validation or test by a seeded hash of its content, so it keeps its side when others
are added. The fingerprint hashes what determines the documents (file contents; a non-streamed hub
dataset's documents; a streamed one's name, config, split and revision), the settings that decide
documents and split, and this code; modification times play no part.
"""

from __future__ import annotations

import glob
import hashlib
import os
import sysconfig
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gptcore.data.config import CorpusConfig
from gptcore.data.documents import (
    SPLITS,
    UNIT_BYTES,
    Reading,
    Segment,
    Unit,
    decode_utf8,
    split_of,
)
from gptcore.errors import ConfigError, DataError
from gptcore.tools.fingerprint import code_version_of, fingerprint, sha256_file

__all__ = ["SPLITS", "Corpus", "SplitStats", "corpus_fingerprint", "decode_utf8", "open_corpus", "split_of"]

BUILTIN_STDLIB = "builtin:python-stdlib"
_STRUCTURED_SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
_GLOB_CHARS = set("*?[")
_HASH_BATCH = 4096


@dataclass(frozen=True)
class SplitStats:
    documents: int
    bytes: int
    replaced_bytes: int


@dataclass(frozen=True)
class Corpus:
    """A source cut into units, and what identifies its documents."""

    cfg: CorpusConfig
    fingerprint: str
    source: str  # for people: builtin:..., local:paths, hub:name/config:split
    reading: Reading
    planned: tuple[Unit, ...] | None  # local sources: every unit; hub: None (they come as rows are read)
    source_bytes: int | None  # what the units cover in all (None for a stream)
    cache_dir: str | None = None

    def units(self, skip: int = 0) -> Iterator[Unit]:
        """The units in source order from the `skip`-th on (a hub source still reads the ones skipped)."""
        if self.planned is not None:
            yield from self.planned[skip:]
            return
        for unit in _stream_units(_hub_texts(self.cfg, self.cache_dir)):
            if unit.index >= skip:
                yield unit

    def record(self) -> SourceRecord:
        """What the token folder's manifest records of its corpus."""
        units = len(self.planned) if self.planned is not None else None
        return SourceRecord(self.fingerprint, self.source, self.reading.format, units, self.source_bytes)

    def to_dict(self) -> dict[str, str | int | None]:
        return asdict(self.record())


@dataclass(frozen=True)
class SourceRecord:
    """A corpus as the token folder's manifest records it (`source`: its keys the fields' names)."""

    fingerprint: str  # the corpus's
    source: str  # for people: builtin:..., local:paths, hub:name/config:split
    format: str  # how its files read: text, jsonl, parquet, stream
    units: int | None  # the units planned (None for a stream)
    source_bytes: int | None  # what they cover in all (None for a stream)


# --- finding files ----------------------------------------------------------------------------------


def stdlib_files() -> list[Path]:
    """The interpreter's standard-library `.py` sources, site-packages excluded, sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for folder, subfolders, names in os.walk(root):
        # Pruned, not filtered: third-party packages may be many times the size of the stdlib.
        subfolders[:] = [name for name in subfolders if name not in ("site-packages", "dist-packages")]
        found.extend(Path(folder) / name for name in names if name.endswith(".py"))
    return sorted(
        (path for path in found if path.is_file()), key=lambda path: path.relative_to(root).as_posix()
    )


def _expand(entry: str, where: str) -> list[Path]:
    if _GLOB_CHARS & set(entry):
        matches = [Path(match) for match in glob.glob(entry, recursive=True)]
        files = sorted(path for path in matches if path.is_file())
        if not files:
            raise DataError(f"{where}: no files match this pattern")
        return files
    path = Path(entry)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(
            child
            for child in path.rglob("*")
            if child.is_file() and not any(part.startswith(".") for part in child.relative_to(path).parts)
        )
        if not files:
            raise DataError(f"{where}: the folder holds no files")
        return files
    raise DataError(f"{where}: no such file or folder")


def local_files(cfg: CorpusConfig) -> list[Path]:
    """Every file the local source names, in the order given (folders and globs sorted), once each."""
    return expand_paths(cfg.paths, "corpus.paths")


def expand_paths(entries: list[str], key: str) -> list[Path]:
    """Every file that `entries` (files, folders, globs) name, in order (folders and globs sorted), once
    each; a DataError naming `key[index]` for an entry that names none."""
    seen: dict[Path, None] = {}
    for index, entry in enumerate(entries):
        for path in _expand(entry, f"{key}[{index}] {entry!r}"):
            seen.setdefault(path.resolve(), None)
    return list(seen)


def local_format(cfg: CorpusConfig, files: list[Path]) -> str:
    """The configured format, or the one the file suffixes agree on."""
    if cfg.format != "auto":
        return cfg.format
    kinds = {_STRUCTURED_SUFFIXES.get(path.suffix.lower(), "text") for path in files}
    if len(kinds) > 1:
        raise ConfigError(
            f"corpus.paths: files of mixed formats ({', '.join(sorted(kinds))}); set corpus.format "
            "or name files of one format"
        )
    return kinds.pop()


def _source_files(cfg: CorpusConfig) -> tuple[list[Path], str]:
    if cfg.source == BUILTIN_STDLIB:
        return stdlib_files(), "text"
    files = local_files(cfg)
    return files, local_format(cfg, files)


# --- fingerprints -----------------------------------------------------------------------------------


def _settings(cfg: CorpusConfig, file_format: str) -> dict[str, str | int | float | None]:
    """What, besides the contents, decides the documents and their split."""
    settings: dict[str, str | int | float | None] = {
        "format": file_format,
        "validation_fraction": cfg.validation_fraction,
        "test_fraction": cfg.test_fraction,
        "split_seed": cfg.split_seed,
        "max_documents": cfg.max_documents,
        "max_bytes": cfg.max_bytes,
    }
    if file_format == "text":
        settings["document_per"] = cfg.document_per
    else:
        settings["text_field"] = cfg.text_field
    if file_format == "stream":
        settings.update(
            name=cfg.hub_name, config=cfg.hub_config, split=cfg.hub_split, revision=cfg.hub_revision
        )
    return settings


def _corpus_code_version() -> str:
    import gptcore.data.corpus
    import gptcore.data.documents

    return code_version_of(gptcore.data.corpus, gptcore.data.documents)


def _files_fingerprint(cfg: CorpusConfig, file_format: str, file_hashes: Iterable[str]) -> str:
    return fingerprint("corpus", _corpus_code_version(), _settings(cfg, file_format), list(file_hashes))


def corpus_fingerprint(cfg: CorpusConfig, cache_dir: Path | None = None) -> str:
    """The fingerprint `open_corpus` gives: file sources hash their files' bytes (each file read once),
    a hub dataset its documents, a streamed one its name, config, split and revision."""
    return open_corpus(cfg, cache_dir).fingerprint


def _sha256_file(path: Path) -> str:
    try:
        return sha256_file(path)  # in 1 MiB pieces: a corpus file of gigabytes is never held whole
    except OSError as error:
        raise DataError(f"{path}: cannot read corpus file ({error.strerror})") from None


# --- opening ----------------------------------------------------------------------------------------


def _reading(cfg: CorpusConfig, file_format: str) -> Reading:
    return Reading(
        format=file_format,
        document_per=cfg.document_per,
        text_field=cfg.text_field,
        split_seed=cfg.split_seed,
        validation_fraction=cfg.validation_fraction,
        test_fraction=cfg.test_fraction,
    )


def describe(cfg: CorpusConfig) -> str:
    if cfg.source == BUILTIN_STDLIB:
        return BUILTIN_STDLIB
    if cfg.source == "hub":
        return f"hub:{cfg.hub_name}" + (f"/{cfg.hub_config}" if cfg.hub_config else "") + f":{cfg.hub_split}"
    return "local:" + ",".join(cfg.paths)


def open_corpus(cfg: CorpusConfig, cache_dir: Path | None = None) -> Corpus:
    """The configured source, planned into units and fingerprinted; no document is held.

    `cache_dir` is where `datasets` keeps what it prepares from a hub source (pass a folder under the
    data root, so nothing lands in the home directory)."""
    cache = str(cache_dir) if cache_dir is not None else None
    if cfg.source == "hub":
        return _open_hub(cfg, cache)
    files, file_format = _source_files(cfg)
    units = tuple(_plan(files, file_format, cfg))
    return Corpus(
        cfg=cfg,
        fingerprint=_files_fingerprint(cfg, file_format, (_sha256_file(path) for path in files)),
        source=describe(cfg),
        reading=_reading(cfg, file_format),
        planned=units,
        source_bytes=sum(unit.size for unit in units),
        cache_dir=cache,
    )


def _plan(files: list[Path], file_format: str, cfg: CorpusConfig) -> Iterator[Unit]:
    """Segments of at most `UNIT_BYTES` (a whole document file may be larger), grouped into units of
    about that size in file order."""
    segments: list[Segment] = []
    size = index = 0
    for segment, length in _segments(files, file_format, cfg):
        if segments and size + length > UNIT_BYTES:
            yield Unit(index, size, tuple(segments))
            segments, size, index = [], 0, index + 1
        segments.append(segment)
        size += length
    if segments:
        yield Unit(index, size, tuple(segments))


def _segments(files: list[Path], file_format: str, cfg: CorpusConfig) -> Iterator[tuple[Segment, int]]:
    for path in files:
        if file_format == "parquet":
            yield from _row_groups(path, cfg.text_field)
            continue
        try:
            length = path.stat().st_size
        except OSError as error:
            raise DataError(f"{path}: cannot read corpus file ({error.strerror})") from None
        if file_format == "text" and cfg.document_per == "file":
            yield Segment(str(path), 0, length), length
            continue
        for start in range(0, max(length, 1), UNIT_BYTES):  # lines: cut anywhere, read from line starts
            stop = min(start + UNIT_BYTES, length)
            yield Segment(str(path), start, stop), stop - start


def _row_groups(path: Path, field: str) -> Iterator[tuple[Segment, int]]:
    """Runs of row groups of about `UNIT_BYTES` (uncompressed), after checking the text column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        source = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as error:
        raise DataError(f"{path}: cannot read as parquet ({_first_line(error)})") from None
    schema = source.schema_arrow
    if field not in schema.names:
        raise DataError(
            f"{path}: no text field {field!r} (corpus.text_field); the columns are "
            f"{', '.join(schema.names) or '(none)'}"
        )
    kind = schema.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(f"{path}: field {field!r} holds {kind}, not text")
    metadata = source.metadata
    start = size = 0
    for group in range(metadata.num_row_groups):
        size += metadata.row_group(group).total_byte_size
        if size >= UNIT_BYTES or group == metadata.num_row_groups - 1:
            yield Segment(str(path), start, group + 1), size
            start, size = group + 1, 0


# --- hub datasets -----------------------------------------------------------------------------------


def _open_hub(cfg: CorpusConfig, cache_dir: str | None) -> Corpus:
    reading = _reading(cfg, "stream")
    if cfg.streaming:
        # A stream has no content hash short of reading all of it: name, config, split and revision
        # (pin `corpus.hub_revision` to make it exact) stand for its documents.
        content = fingerprint("corpus", _corpus_code_version(), _settings(cfg, "stream"))
    else:
        digest = hashlib.sha256()
        for text in _hub_texts(cfg, cache_dir):
            digest.update(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest())
        content = fingerprint("corpus", _corpus_code_version(), _settings(cfg, "hub"), digest.hexdigest())
    return Corpus(cfg, content, describe(cfg), reading, None, None, cache_dir)


def _stream_units(texts: Iterator[str]) -> Iterator[Unit]:
    batch: list[str] = []
    size = index = 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= UNIT_BYTES:
            yield Unit(index, size, texts=tuple(batch))
            batch, size, index = [], 0, index + 1
    if batch:
        yield Unit(index, size, texts=tuple(batch))


def _hub_texts(cfg: CorpusConfig, cache_dir: str | None) -> Iterator[str]:
    """The hub dataset's `text_field` in order: streamed, or from the Arrow files `datasets` prepares."""
    where = f"corpus.hub_name {cfg.hub_name!r}"
    if cache_dir is None:
        with tempfile.TemporaryDirectory(prefix="gptpipe-datasets-") as temporary:
            yield from _hub_texts(cfg, temporary)
        return
    dataset = _hub_dataset(cfg, cache_dir, where)
    columns = list(dataset.column_names or [])
    if columns and cfg.text_field not in columns:
        raise DataError(
            f"{where}: no text field {cfg.text_field!r} (corpus.text_field); the columns are "
            f"{', '.join(columns)}"
        )
    if hasattr(dataset, "select_columns"):
        dataset = dataset.select_columns([cfg.text_field])
    for batch in dataset.iter(batch_size=_HASH_BATCH):
        for text in batch[cfg.text_field]:
            if text is not None and not isinstance(text, str):
                raise DataError(f"{where}: field {cfg.text_field!r} holds {type(text).__name__}, not text")
            yield text or ""


def _hub_dataset(cfg: CorpusConfig, cache_dir: str, where: str) -> Any:
    """The corpus's hub dataset (`hub_dataset`), in the corpus section's words."""
    return hub_dataset(HubSource(cfg.hub_name or "", cfg.hub_config, cfg.hub_split, cfg.hub_revision,
                                 cfg.streaming), cache_dir, where, "corpus")  # fmt: skip


@dataclass(frozen=True)
class HubSource:
    """A dataset on the Hugging Face hub (or a copy saved with `save_to_disk`, named by its folder)."""

    name: str
    config: str | None
    split: str
    revision: str | None
    streaming: bool


def hub_dataset(source: HubSource, cache_dir: str | None, where: str, section: str) -> Any:
    """`datasets.load_dataset` by name, or a saved copy's folder; a DataError naming `where` (and the
    `section` whose keys say where else to look) for a split, a name or a hub it cannot have."""
    import datasets

    local = Path(source.name)
    try:
        if (local / "state.json").is_file() or (local / "dataset_dict.json").is_file():
            loaded = datasets.load_from_disk(str(local))
            if isinstance(loaded, datasets.DatasetDict):
                if source.split not in loaded:
                    raise DataError(f"{where}: no split {source.split!r} (splits: {', '.join(loaded)})")
                loaded = loaded[source.split]
            return loaded.to_iterable_dataset() if source.streaming else loaded
        return datasets.load_dataset(
            source.name,
            source.config,
            split=source.split,
            revision=source.revision,
            cache_dir=cache_dir,
            streaming=source.streaming,
        )
    except DataError:
        raise
    except ConnectionError as error:
        raise DataError(
            f"{where}: the Hugging Face hub is unreachable ({_first_line(error)}); download the dataset "
            f"where the hub is reachable and set {section}.hub_name to its local folder, or use "
            f"{section}.source: local with {section}.paths naming its files"
        ) from None
    except Exception as error:  # unknown names, bad configs and splits come as many kinds
        raise DataError(f"{where}: cannot load ({type(error).__name__}: {_first_line(error)})") from None


def _first_line(error: BaseException) -> str:
    cause = error.__cause__ or error
    lines = str(cause).strip().splitlines() or [type(cause).__name__]
    return lines[0][:300]
