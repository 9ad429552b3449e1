"""Token files: every document encoded, followed by the end-of-text id, streamed to disk.

Train and validation become `<data_root>/tokens/<fingerprint>/{train,validation}.bin` (flat little-endian
uint16 when the vocabulary fits, else uint32) with `*.bin.manifest.json` beside each and a folder
`manifest.json`. Documents go through the encoder in slices of about a megabyte on every core, and each
slice's ids are written as soon as they come back, so memory stays bounded by a few slices. The folder is
written under a hidden temporary name and renamed when complete.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from gptcore.data.corpus import SPLITS, Corpus, iter_texts
from gptcore.errors import ConfigError, DataError
from gptcore.data.encoders import Encoder, HFEncoder, first_difference, make_encoder
from gptcore.tools.fingerprint import code_version_of, fingerprint
from gptcore.tools.atomic import publish_directory, staging_directory
from gptcore.data.tokenfile import (
    FORMAT_VERSION,
    TokenFileManifest,
    dtype_for_vocab,
    manifest_path,
    write_manifest,
)
from gptcore.data.tokenizer import TokenizerManifest, load_tokenizer

ENCODERS = ("auto", "tiktoken", "tokenizers")
FOLDER_MANIFEST = "manifest.json"
SLICE_DOCUMENTS = 16384
VERIFY_FRACTION = 0.02  # share of documents the fast encoder is checked on against encode_batch_fast
VERIFY_MAX_CHARACTERS = 1 << 16


@dataclass(frozen=True)
class SplitTokens:
    """One split's token file in the folder: where it is, its hash and its counts."""

    split: str
    path: str
    manifest_path: str
    sha256: str
    tokens: int
    documents: int
    text_bytes: int = 0  # the split's documents in UTF-8: the denominator of bits per byte


@dataclass(frozen=True)
class TokenFolderManifest:
    """The token folder's `manifest.json`: how it was built and its splits (each file also has its own
    `TokenFileManifest` beside it, which readers of a single file use)."""

    fingerprint: str
    corpus_fingerprint: str
    tokenizer_fingerprint: str
    tokenizer_sha256: str
    directory: str
    dtype: str
    vocab_size: int
    end_of_text_id: int
    encoder: str
    verified_documents: int
    files: dict[str, SplitTokens]
    seconds: float
    tokens_per_second: float
    fallback_reason: str | None = None
    format_version: int = FORMAT_VERSION
    code_version: str = field(default="")

    @property
    def train(self) -> SplitTokens:
        return self.files["train"]

    @property
    def validation(self) -> SplitTokens:
        return self.files["validation"]

    @property
    def test(self) -> SplitTokens:
        return self.files["test"]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TokenFolderManifest:
        files = {name: SplitTokens(**value) for name, value in data["files"].items()}
        return cls(**{**data, "files": files})


def _code_version() -> str:
    import gptcore.data.encoders
    import gptcore.data.build
    import gptcore.data.tokenfile

    return code_version_of(gptcore.data.build, gptcore.data.encoders, gptcore.data.tokenfile)


def token_files_fingerprint(corpus_fingerprint: str, tokenizer: TokenizerManifest) -> str:
    """Corpus + tokenizer (by fingerprint and content) + this code and format: what decides the files."""
    return fingerprint(
        "tokens", corpus_fingerprint, tokenizer.fingerprint, tokenizer.sha256, _code_version(), FORMAT_VERSION
    )


class EncoderMismatch(Exception):
    """The fast encoder gave other ids than the reference on a checked document."""


# --- encoding in parallel, in order ---------------------------------------------------------------


def _slices(dataset: datasets.Dataset, characters: int) -> Iterator[tuple[int, list[str]]]:
    """(index of the first document, documents) in slices of about `characters` characters."""
    start, texts, size = 0, [], 0
    for batch in iter_texts(dataset, batch_size=256):
        for text in batch:
            texts.append(text)
            size += len(text)
            if size >= characters or len(texts) >= SLICE_DOCUMENTS:
                yield start, texts
                start, texts, size = start + len(texts), [], 0
    if texts:
        yield start, texts


def _ordered(work: Callable[[Any], Any], items: Iterator[Any], threads: int) -> Iterator[tuple[Any, Any]]:
    """(item, result) in input order, with a bounded number of items in flight on `threads` threads."""
    window = 2 * threads
    with ThreadPoolExecutor(threads, thread_name_prefix="encode") as pool:
        pending: deque[tuple[Any, Future]] = deque()
        for item in items:
            pending.append((item, pool.submit(work, item)))
            if len(pending) >= window:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()


def _join(arrays: Sequence[np.ndarray], end_of_text_id: int) -> np.ndarray:
    """The documents' ids, each followed by the end-of-text id, as one uint32 array."""
    out = np.empty(sum(len(array) for array in arrays) + len(arrays), dtype=np.uint32)
    position = 0
    for array in arrays:
        out[position : position + len(array)] = array
        position += len(array)
        out[position] = end_of_text_id
        position += 1
    return out


def _sampled(first_index: int, texts: Sequence[str], fraction: float) -> list[int]:
    """A deterministic spread of positions within a slice, skipping the largest documents.

    The reference encodes one document on one core, so a huge one would stall the build; the
    benchmark compares every document, these included.
    """
    modulus = 10007
    return [
        offset
        for offset, text in enumerate(texts)
        if ((first_index + offset) * 2654435761) % modulus < fraction * modulus
        and len(text) <= VERIFY_MAX_CHARACTERS
    ]


# --- writing one split ----------------------------------------------------------------------------


@dataclass
class _Written:
    sha256: str
    tokens: int
    documents: int
    verified: int


def _write_split(
    dataset: datasets.Dataset,
    path: Path,
    encoder: Encoder,
    reference: Encoder | None,
    *,
    dtype: str,
    vocab_size: int,
    end_of_text_id: int,
    verify_fraction: float,
    advance: Callable[[int], None],
) -> _Written:
    reference = reference if verify_fraction > 0 else None
    digest = hashlib.sha256()
    tokens = documents = verified = 0
    file_dtype = np.dtype(dtype).newbyteorder("<")

    def encode(item: tuple[int, list[str]]) -> tuple[np.ndarray, int]:
        # On the worker threads: encoding, checking against the reference and joining all run in parallel.
        first, texts = item
        arrays = encoder.encode_batch(texts)
        checked = _verify(first, texts, arrays, reference, verify_fraction) if reference else 0
        return _join(arrays, end_of_text_id), checked

    with open(path, "wb") as out:
        for (_, texts), (ids, checked) in _ordered(
            encode, _slices(dataset, encoder.slice_characters), encoder.threads
        ):
            verified += checked
            if len(ids) and int(ids.max()) >= vocab_size:
                raise DataError(
                    f"{path}: encoder produced id {int(ids.max())} outside the vocabulary {vocab_size}"
                )
            chunk = ids.astype(file_dtype, copy=False)
            out.write(chunk.data)
            digest.update(chunk.data)
            tokens += len(chunk)
            documents += len(texts)
            advance(len(texts))
    return _Written(digest.hexdigest(), tokens, documents, verified)


def _verify(
    first: int, texts: list[str], arrays: list[np.ndarray], reference: Encoder, fraction: float
) -> int:
    chosen = _sampled(first, texts, fraction)
    if not chosen:
        return 0
    wrong = first_difference([texts[i] for i in chosen], [arrays[i] for i in chosen], reference)
    if wrong is not None:
        raise EncoderMismatch(f"document {first + chosen[wrong]} encodes differently")
    return len(chosen)


# --- the stage ------------------------------------------------------------------------------------


def build_token_files(
    corpus: Corpus,
    tokenizer: TokenizerManifest,
    data_root: Path,
    *,
    encoder: str = "auto",
    verify_fraction: float = VERIFY_FRACTION,
) -> TokenFolderManifest:
    """Encode both splits into `<data_root>/tokens/<fingerprint>/`; the folder appears only when complete.

    `encoder`: `auto` (tiktoken where it reproduces the tokenizer, else `encode_batch_fast`),
    `tiktoken` or `tokenizers`. A fast encoder is checked on `verify_fraction` of the documents against
    `encode_batch_fast`; on any difference the build starts over with `encode_batch_fast`.
    """
    if encoder not in ENCODERS:
        raise ConfigError(f"encoder {encoder!r} is not allowed: expected one of {', '.join(ENCODERS)}")
    started = time.perf_counter()
    key = token_files_fingerprint(corpus.fingerprint, tokenizer)
    final = Path(data_root).resolve() / "tokens" / key
    reference = HFEncoder(load_tokenizer(tokenizer))
    chosen = reference if encoder == "tokenizers" else make_encoder(tokenizer.path, encoder)
    fallback = None
    # At most one token a text byte (byte-level BPE), at the token files' width.
    itemsize = np.dtype(dtype_for_vocab(tokenizer.vocab_size)).itemsize
    needed = sum(stats.bytes for stats in corpus.stats.values()) * itemsize
    with staging_directory(final, needed) as staging:
        try:
            written = _write_splits(corpus, tokenizer, staging, chosen, reference, verify_fraction)
        except EncoderMismatch as mismatch:
            fallback = f"{chosen.name}: {mismatch}; rebuilt with {reference.name}"
            chosen = reference
            written = _write_splits(corpus, tokenizer, staging, reference, None, 0.0)
        seconds = time.perf_counter() - started
        manifest = _folder_manifest(corpus, tokenizer, key, final, chosen, written, seconds, fallback)
        _write_file_manifests(staging, corpus, tokenizer, manifest)
        publish_directory(staging, final)
    return manifest


def _write_splits(
    corpus: Corpus,
    tokenizer: TokenizerManifest,
    staging: Path,
    encoder: Encoder,
    reference: Encoder | None,
    verify_fraction: float,
) -> dict[str, _Written]:
    with _progress(sum(len(split) for split in corpus.splits.values())) as advance:
        return {
            split: _write_split(
                corpus.splits[split],
                staging / f"{split}.bin",
                encoder,
                reference if encoder is not reference else None,
                dtype=dtype_for_vocab(tokenizer.vocab_size),
                vocab_size=tokenizer.vocab_size,
                end_of_text_id=tokenizer.end_of_text_id,
                verify_fraction=verify_fraction,
                advance=advance,
            )
            for split in SPLITS
        }


def _folder_manifest(
    corpus: Corpus,
    tokenizer: TokenizerManifest,
    key: str,
    final: Path,
    encoder: Encoder,
    written: dict[str, _Written],
    seconds: float,
    fallback: str | None,
) -> TokenFolderManifest:
    files = {
        split: SplitTokens(
            split=split,
            path=str(final / f"{split}.bin"),
            manifest_path=str(manifest_path(final / f"{split}.bin")),
            sha256=result.sha256,
            tokens=result.tokens,
            documents=result.documents,
            text_bytes=corpus.stats[split].bytes,
        )
        for split, result in written.items()
    }
    total = sum(result.tokens for result in written.values())
    return TokenFolderManifest(
        fingerprint=key,
        corpus_fingerprint=corpus.fingerprint,
        tokenizer_fingerprint=tokenizer.fingerprint,
        tokenizer_sha256=tokenizer.sha256,
        directory=str(final),
        dtype=dtype_for_vocab(tokenizer.vocab_size),
        vocab_size=tokenizer.vocab_size,
        end_of_text_id=tokenizer.end_of_text_id,
        encoder=encoder.name,
        verified_documents=sum(result.verified for result in written.values()),
        files=files,
        seconds=round(seconds, 3),
        tokens_per_second=round(total / seconds, 1) if seconds > 0 else 0.0,
        fallback_reason=fallback,
        code_version=_code_version(),
    )


def _write_file_manifests(
    staging: Path, corpus: Corpus, tokenizer: TokenizerManifest, manifest: TokenFolderManifest
) -> None:
    for split, token_file in manifest.files.items():
        write_manifest(
            staging / f"{split}.bin",
            TokenFileManifest(
                dtype=manifest.dtype,
                token_count=token_file.tokens,
                document_count=token_file.documents,
                vocab_size=tokenizer.vocab_size,
                tokenizer_sha256=tokenizer.sha256,
                corpus_fingerprint=corpus.fingerprint,
                split=split,
                sha256=token_file.sha256,
                end_of_text_id=tokenizer.end_of_text_id,
                text_bytes=token_file.text_bytes,
            ),
        )
    (staging / FOLDER_MANIFEST).write_text(json.dumps(manifest.to_dict(), indent=2), encoding="utf-8")


def read_token_folder_manifest(folder: Path) -> TokenFolderManifest:
    path = Path(folder) / FOLDER_MANIFEST
    try:
        return TokenFolderManifest.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise DataError(f"{path}: token-files manifest not found") from None
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise DataError(
            f"{path}: unreadable token-files manifest ({type(error).__name__}: {error})"
        ) from None


class _progress:
    """A rich progress bar over documents on a terminal; silent otherwise."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.bar: Any = None

    def __enter__(self) -> Callable[[int], None]:
        if not sys.stderr.isatty():
            return lambda count: None
        from rich.console import Console
        from rich.progress import Progress

        self.bar = Progress(console=Console(stderr=True), transient=True)
        self.bar.start()
        task = self.bar.add_task("encoding documents", total=self.total)
        return lambda count: self.bar.advance(task, count)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
