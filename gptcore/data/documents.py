"""Documents out of a corpus's units: the pieces of a source that are read, split and encoded alone.

A unit is a few megabytes of the source: byte ranges of text or JSON-lines files (cut at line starts),
row groups of parquet files, whole small files grouped, or documents that came from a stream. Every
worker reads its units from disk itself, so the parent never holds the corpus, and the units depend on
the source alone, so one worker and many cut the same documents in the same order.

Kept light (no `datasets`, no torch): the encoding processes import this module.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from gptcore.errors import DataError

SPLITS = ("train", "validation", "test")
UNIT_BYTES = 4 << 20  # a unit's source bytes: many per worker even for a small corpus, little to hold
MAX_LINE_BYTES = 64 << 20  # one line of a line-per-document corpus: a long book, not a whole file


@dataclass(frozen=True)
class Segment:
    """A part of one file: bytes `start`..`stop` (text and JSON lines: the lines starting there), or row
    groups `start`..`stop` (parquet)."""

    path: str
    start: int
    stop: int


@dataclass(frozen=True)
class Unit:
    """The source's `index`-th piece: file segments, or documents already read from a stream."""

    index: int
    size: int  # source bytes it covers (text bytes for streamed documents)
    segments: tuple[Segment, ...] = ()
    texts: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Reading:
    """How a unit's bytes become documents, and how a document finds its split."""

    format: str  # text | jsonl | parquet | stream
    document_per: str  # text: file | line
    text_field: str
    split_seed: int
    validation_fraction: float
    test_fraction: float

    def split_of(self, data: bytes) -> str:
        return split_of(data, self.split_seed, self.validation_fraction, self.test_fraction)


@dataclass(frozen=True)
class Document:
    text: str
    data: bytes  # its UTF-8 bytes: what the split hash and the byte counts read
    replaced: int  # undecodable source bytes that became U+FFFD


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


def _document(raw: bytes) -> Document:
    text, replaced = decode_utf8(raw)
    return Document(text, raw if not replaced else text.encode("utf-8"), replaced)


def _from_text(text: str) -> Document:
    return Document(text, text.encode("utf-8", "surrogatepass"), 0)


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


# --- reading a unit ---------------------------------------------------------------------------------


def read_documents(unit: Unit, reading: Reading) -> Iterator[Document]:
    """The unit's documents in source order, empty ones included (the caller skips and counts them)."""
    if unit.texts is not None:
        for text in unit.texts:
            yield _from_text(text)
        return
    for segment in unit.segments:
        try:
            if reading.format == "parquet":
                yield from _parquet_rows(segment, reading.text_field)
            elif reading.format == "jsonl":
                yield from _json_lines(segment, reading.text_field)
            elif reading.document_per == "line":
                for _, line in _lines(segment):
                    yield _document(line.rstrip(b"\r\n"))
            else:
                with open(segment.path, "rb") as handle:
                    yield _document(handle.read())
        except OSError as error:
            raise DataError(f"{segment.path}: cannot read corpus file ({error.strerror or error})") from None


def split_documents(unit: Unit, reading: Reading) -> Iterator[tuple[str | None, Document]]:
    """(split, document) for each of the unit's documents in source order; None for an empty one."""
    for document in read_documents(unit, reading):
        yield (reading.split_of(document.data) if document.text else None), document


def _lines(segment: Segment) -> Iterator[tuple[int, bytes]]:
    """(offset, line) for every line starting at a byte in `start`..`stop`: the segments of one file
    cover each line exactly once, wherever the cuts fall."""
    with open(segment.path, "rb") as handle:
        offset = segment.start
        if offset > 0:
            handle.seek(offset - 1)
            offset += len(handle.readline()) - 1  # the rest of the line that started before the cut
        while offset < segment.stop:
            line = handle.readline(MAX_LINE_BYTES + 1)  # never a whole huge line in memory
            if not line:
                return
            if len(line) > MAX_LINE_BYTES:
                raise DataError(
                    f"{segment.path}: line at byte {offset}: longer than {MAX_LINE_BYTES // 2**20} MiB, "
                    "the most one line (one document) may hold; split it"
                )
            yield offset, line
            offset += len(line)


def _depth_limit() -> int:
    import sys

    return sys.getrecursionlimit()


def _json_lines(segment: Segment, field: str) -> Iterator[Document]:
    for offset, line in _lines(segment):
        if not line.strip():
            continue
        text, replaced = decode_utf8(line)
        where = f"{segment.path}: line at byte {offset}"
        try:
            row = json.loads(text)
        except json.JSONDecodeError as error:
            raise DataError(f"{where}: cannot read as jsonl ({error.msg} at column {error.colno})") from None
        except RecursionError:  # the parser's depth is the interpreter's recursion limit
            raise DataError(
                f"{where}: cannot read as jsonl (nested deeper than {_depth_limit()} levels)"
            ) from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: cannot read as jsonl (a {type(row).__name__}, not an object)")
        value = row.get(field)
        if value is None and field not in row:
            raise DataError(
                f"{where}: no text field {field!r} (corpus.text_field); the fields are "
                f"{', '.join(row) or '(none)'}"
            )
        if value is not None and not isinstance(value, str):
            raise DataError(f"{where}: field {field!r} holds {type(value).__name__}, not text")
        document = _from_text(value or "")
        yield Document(document.text, document.data, replaced)


def _parquet_rows(segment: Segment, field: str) -> Iterator[Document]:
    import pyarrow.parquet as pq

    source = pq.ParquetFile(segment.path)
    groups = list(range(segment.start, segment.stop))
    for batch in source.iter_batches(batch_size=1024, row_groups=groups, columns=[field]):
        for text in batch.column(0).to_pylist():
            yield _from_text(text or "")
