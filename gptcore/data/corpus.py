"""Corpus sources: documents from the standard library, local files or the hub, as Arrow datasets.

Every source ends as two `datasets.Dataset`s with one `text` column, split into train and validation by
a seeded hash of each document's content, so a document stays on its side when others are added.
The corpus fingerprint hashes what determines the documents (file contents, or the documents
themselves for hub datasets), the split settings and this module's code; modification times play no part.
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import os
import sysconfig
import tempfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import datasets

from gptcore.config import CorpusConfig
from gptcore.errors import ConfigError, DataError
from gptcore.tools.fingerprint import code_version_of, fingerprint, sha256_file

BUILTIN_STDLIB = "builtin:python-stdlib"
SPLITS = ("train", "validation", "test")
_STRUCTURED_SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
_GLOB_CHARS = set("*?[")
_HASH_BATCH = 4096


# --- the result -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitStats:
    documents: int
    bytes: int
    replaced_bytes: int


@dataclass(frozen=True)
class Corpus:
    """The documents of each split (Arrow, one `text` column) and what identifies them."""

    splits: dict[str, datasets.Dataset]  # train, validation, test
    fingerprint: str
    source: str
    stats: dict[str, SplitStats]
    empty_documents_skipped: int

    @property
    def train(self) -> datasets.Dataset:
        return self.splits["train"]

    @property
    def validation(self) -> datasets.Dataset:
        return self.splits["validation"]

    @property
    def test(self) -> datasets.Dataset:
        """Held out: never trained on, never used to choose a checkpoint or to gate (the evaluate stage)."""
        return self.splits["test"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "source": self.source,
            "stats": {name: asdict(stats) for name, stats in self.stats.items()},
            "empty_documents_skipped": self.empty_documents_skipped,
        }


# --- decoding, with undecodable bytes replaced and counted ------------------------------------------

_replaced = threading.local()


def _count_and_replace(error: UnicodeError) -> tuple[str, int]:
    assert isinstance(error, UnicodeDecodeError)
    _replaced.count += error.end - error.start
    return "\ufffd", error.end


codecs.register_error("gptcore-count-replace", _count_and_replace)


def decode_utf8(raw: bytes) -> tuple[str, int]:
    """The text, and how many undecodable bytes were replaced by U+FFFD."""
    try:
        return raw.decode("utf-8"), 0
    except UnicodeDecodeError:
        _replaced.count = 0
        text = raw.decode("utf-8", "gptcore-count-replace")
        return text, _replaced.count


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


def _expand(entry: str, index: int) -> list[Path]:
    where = f"corpus.paths[{index}] {entry!r}"
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
    seen: dict[Path, None] = {}
    for index, entry in enumerate(cfg.paths):
        for path in _expand(entry, index):
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


def _settings(cfg: CorpusConfig, file_format: str) -> dict[str, Any]:
    """What, besides the contents, decides the documents and their split."""
    settings = {
        "format": file_format,
        "validation_fraction": cfg.validation_fraction,
        "test_fraction": cfg.test_fraction,
        "split_seed": cfg.split_seed,
        "max_documents": cfg.max_documents,
    }
    if file_format == "text":
        settings["document_per"] = cfg.document_per
    else:
        settings["text_field"] = cfg.text_field
    return settings


def _corpus_code_version() -> str:
    import gptcore.data.corpus

    return code_version_of(gptcore.data.corpus)


def _files_fingerprint(cfg: CorpusConfig, file_format: str, file_hashes: Iterable[str]) -> str:
    return fingerprint("corpus", _corpus_code_version(), _settings(cfg, file_format), list(file_hashes))


def corpus_fingerprint(cfg: CorpusConfig, cache_dir: Path | None = None) -> str:
    """The fingerprint `load_corpus` would give; for file sources it only hashes the files' bytes."""
    if cfg.source == "hub":
        return load_corpus(cfg, cache_dir).fingerprint
    files, file_format = _source_files(cfg)
    return _files_fingerprint(cfg, file_format, (_sha256_file(path) for path in files))


def _sha256_file(path: Path) -> str:
    try:
        return sha256_file(path)  # in 1 MiB pieces: a corpus file of gigabytes is never held whole
    except OSError as error:
        raise DataError(f"{path}: cannot read corpus file ({error.strerror})") from None


# --- splitting --------------------------------------------------------------------------------------


def split_of(document: bytes, seed: int, validation_fraction: float, test_fraction: float) -> str:
    """A seeded hash of the content alone decides the split, stable when other documents come and go:
    the hash's lowest `validation_fraction` of values go to validation, the next `test_fraction` to test
    (so adding a test split took its documents from train and left validation as it was)."""
    digest = hashlib.blake2b(document, digest_size=8, salt=seed.to_bytes(16, "little", signed=True)).digest()
    value = int.from_bytes(digest, "little")
    if value < validation_fraction * (1 << 64):
        return "validation"
    if value < (validation_fraction + test_fraction) * (1 << 64):
        return "test"
    return "train"


class _Splitter:
    """Assigns documents to a split and keeps the per-split tallies."""

    def __init__(self, cfg: CorpusConfig) -> None:
        self.cfg = cfg
        self.tallies = {split: [0, 0, 0] for split in SPLITS}
        self.empty = 0

    def side(self, text: str | None, replaced: int = 0) -> str | None:
        """The split of a document, or None for a document skipped (empty, or past max_documents)."""
        if not text:
            self.empty += 1
            return None
        limit = self.cfg.max_documents
        if limit is not None and self.documents >= limit:
            return None
        data = text.encode("utf-8", "surrogatepass")
        cfg = self.cfg
        side = split_of(data, cfg.split_seed, cfg.validation_fraction, cfg.test_fraction)
        tally = self.tallies[side]
        tally[0] += 1
        tally[1] += len(data)
        tally[2] += replaced
        return side

    @property
    def documents(self) -> int:
        return sum(tally[0] for tally in self.tallies.values())

    def stats(self, where: str) -> dict[str, SplitStats]:
        stats = {split: SplitStats(*self.tallies[split]) for split in SPLITS}
        if self.documents == 0:
            raise DataError(f"{where}: the corpus holds no documents (every one is empty)")
        for name, split in stats.items():
            if split.documents == 0:
                raise DataError(
                    f"{where}: the {name} split is empty ({self.documents} documents, "
                    f"corpus.validation_fraction {self.cfg.validation_fraction}, corpus.test_fraction "
                    f"{self.cfg.test_fraction}); add documents or change the fractions"
                )
        return stats


# --- loading ----------------------------------------------------------------------------------------


def load_corpus(cfg: CorpusConfig, cache_dir: Path | None = None) -> Corpus:
    """Read the configured source into Arrow and split it.

    `cache_dir` is where `datasets` keeps what it prepares from JSON lines, parquet and hub sources
    (pass a folder under the data root); without one it works in a temporary folder and keeps the
    result in memory, so nothing lands in the home directory.
    """
    if cfg.source == "hub":
        return _with_cache(cache_dir, lambda cache, memory: _load_hub(cfg, cache, memory))
    files, file_format = _source_files(cfg)
    if file_format == "text":
        return _load_text_files(cfg, files)
    return _with_cache(
        cache_dir, lambda cache, memory: _load_structured(cfg, files, file_format, cache, memory)
    )


def _with_cache(cache_dir: Path | None, load: Any) -> Corpus:
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        return load(str(cache_dir), False)
    with tempfile.TemporaryDirectory(prefix="gptpipe-datasets-") as temporary:
        return load(temporary, True)


def _describe(cfg: CorpusConfig) -> str:
    if cfg.source == BUILTIN_STDLIB:
        return BUILTIN_STDLIB
    if cfg.source == "hub":
        return f"hub:{cfg.hub_name}" + (f"/{cfg.hub_config}" if cfg.hub_config else "") + f":{cfg.hub_split}"
    return "local:" + ",".join(cfg.paths)


def _text_documents(cfg: CorpusConfig, files: list[Path], hashes: list[str]) -> Iterator[tuple[str, int]]:
    """Each file once (its hash noted for the fingerprint), as documents with their replaced-byte counts."""
    for path in files:
        try:
            raw = path.read_bytes()
        except OSError as error:
            raise DataError(f"{path}: cannot read corpus file ({error.strerror})") from None
        hashes.append(hashlib.sha256(raw).hexdigest())
        text, replaced = decode_utf8(raw)
        if cfg.document_per == "file":
            yield text, replaced
        else:
            # Replaced bytes are counted per file; they are charged to the file's first line.
            for number, line in enumerate(text.splitlines()):
                yield line, replaced if number == 0 else 0


def _load_text_files(cfg: CorpusConfig, files: list[Path]) -> Corpus:
    splitter = _Splitter(cfg)
    sides: dict[str, list[str]] = {split: [] for split in SPLITS}
    hashes: list[str] = []
    for text, replaced in _text_documents(cfg, files, hashes):
        side = splitter.side(text, replaced)
        if side:
            sides[side].append(text)
    stats = splitter.stats(_describe(cfg))
    return Corpus(
        splits={split: datasets.Dataset.from_dict({"text": texts}) for split, texts in sides.items()},
        fingerprint=_files_fingerprint(cfg, "text", hashes),
        source=_describe(cfg),
        stats=stats,
        empty_documents_skipped=splitter.empty,
    )


def _load_structured(
    cfg: CorpusConfig, files: list[Path], file_format: str, cache_dir: str, in_memory: bool
) -> Corpus:
    builder = "json" if file_format == "jsonl" else "parquet"
    where = f"corpus.paths ({file_format}: {files[0]}{' ...' if len(files) > 1 else ''})"
    try:
        dataset = datasets.load_dataset(
            builder,
            data_files=[str(path) for path in files],
            split="train",
            cache_dir=cache_dir,
            keep_in_memory=in_memory,
        )
    except Exception as error:  # datasets wraps parse errors in several kinds; name the files instead
        raise DataError(f"{where}: cannot read as {file_format} ({_first_line(error)})") from None
    hashes = [_sha256_file(path) for path in files]
    return _split_dataset(cfg, dataset, where, _files_fingerprint(cfg, file_format, hashes))


def _load_hub(cfg: CorpusConfig, cache_dir: str, in_memory: bool) -> Corpus:
    where = f"corpus.hub_name {cfg.hub_name!r}"
    dataset = _hub_dataset(cfg, cache_dir, in_memory, where)
    digest = hashlib.sha256()
    corpus = _split_dataset(cfg, dataset, where, None, digest)
    # Hub datasets have no files of ours to hash: the fingerprint hashes the documents themselves.
    content = fingerprint("corpus", _corpus_code_version(), _settings(cfg, "hub"), digest.hexdigest())
    return Corpus(**{**corpus.__dict__, "fingerprint": content})


def _hub_dataset(cfg: CorpusConfig, cache_dir: str, in_memory: bool, where: str) -> datasets.Dataset:
    """`datasets.load_dataset` by name (or a local dataset folder, or one saved with `save_to_disk`)."""
    local = Path(str(cfg.hub_name))
    try:
        if (local / "state.json").is_file() or (local / "dataset_dict.json").is_file():
            loaded = datasets.load_from_disk(str(local), keep_in_memory=in_memory)
            if isinstance(loaded, datasets.DatasetDict):
                if cfg.hub_split not in loaded:
                    raise DataError(f"{where}: no split {cfg.hub_split!r} (splits: {', '.join(loaded)})")
                return loaded[cfg.hub_split]
            return loaded
        return datasets.load_dataset(
            str(cfg.hub_name),
            cfg.hub_config,
            split=cfg.hub_split,
            cache_dir=cache_dir,
            keep_in_memory=in_memory,
        )
    except DataError:
        raise
    except ConnectionError as error:
        raise DataError(
            f"{where}: the Hugging Face hub is unreachable ({_first_line(error)}); download the dataset "
            "where the hub is reachable and set corpus.hub_name to its local folder, or use "
            "corpus.source: local with corpus.paths naming its jsonl/parquet/text files"
        ) from None
    except Exception as error:  # unknown names, bad configs and splits come as many kinds
        raise DataError(f"{where}: cannot load ({type(error).__name__}: {_first_line(error)})") from None


def _first_line(error: BaseException) -> str:
    cause = error.__cause__ or error
    lines = str(cause).strip().splitlines() or [type(cause).__name__]
    return lines[0][:300]


def _split_dataset(
    cfg: CorpusConfig,
    dataset: datasets.Dataset,
    where: str,
    content_fingerprint: str | None,
    digest: Any = None,
) -> Corpus:
    """Pick the text column and split by content hash, hashing the documents in order into `digest`."""
    if cfg.text_field not in dataset.column_names:
        raise DataError(
            f"{where}: no text field {cfg.text_field!r} (corpus.text_field); the columns are "
            f"{', '.join(dataset.column_names) or '(none)'}"
        )
    feature = dataset.features[cfg.text_field]
    if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")):
        raise DataError(f"{where}: field {cfg.text_field!r} holds {feature}, not text")
    dataset = dataset.select_columns([cfg.text_field])
    splitter = _Splitter(cfg)
    indices: dict[str, list[int]] = {split: [] for split in SPLITS}
    for start in range(0, len(dataset), _HASH_BATCH):
        texts = dataset[start : start + _HASH_BATCH][cfg.text_field]
        for offset, text in enumerate(texts):
            side = splitter.side(text)
            if side:
                indices[side].append(start + offset)
                if digest is not None:
                    digest.update(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest())
        if cfg.max_documents is not None and splitter.documents >= cfg.max_documents:
            break
    stats = splitter.stats(where)
    if cfg.text_field != "text":
        dataset = dataset.rename_column(cfg.text_field, "text")
    return Corpus(
        splits={split: dataset.select(chosen) for split, chosen in indices.items()},
        fingerprint=content_fingerprint or "",
        source=_describe(cfg),
        stats=stats,
        empty_documents_skipped=splitter.empty,
    )


def iter_texts(dataset: datasets.Dataset, batch_size: int = 256) -> Iterator[list[str]]:
    """The `text` column in batches of Python strings, never the whole column at once."""
    for start in range(0, len(dataset), batch_size):
        yield dataset[start : start + batch_size]["text"]
