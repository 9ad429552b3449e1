"""Token files: flat little-endian streams of token ids, memory-mapped, described by a manifest.

The layout is the one other small-GPT tools read (`train.bin`, uint16 when the vocabulary fits). Beside
each stream lies `<name>.manifest.json`: dtype, counts, vocabulary, tokenizer hash, corpus fingerprint,
format version. A sharded split is its manifest alone (`train.manifest.json`) listing its shards
(`train-000000.bin`, ...), read as one stream: every shard is checked for size and sha256 when opened.
The reader also takes bare `.bin` streams (uint16) and `.pt` files holding a 1-D tensor.

A stream of conversations (`gptcore.chat.tokens`) carries a loss mask beside it (`<name>.loss_mask.bin`,
one uint8 a token: 1 where the token is one the model is trained to write, an assistant's) and is laid
out as whole examples of `example_tokens` tokens each, so an example never starts inside a conversation.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from gptcore.data.shards import Shard
from gptcore.errors import DataError
from gptcore.tools.atomic import write_text_atomic

FORMAT_VERSION = 1
MANIFEST_SUFFIX = ".manifest.json"


def dtype_for_vocab(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


@dataclass(frozen=True)
class TokenFileManifest:
    dtype: str
    token_count: int
    document_count: int
    vocab_size: int
    tokenizer_sha256: str
    corpus_fingerprint: str
    split: str
    sha256: str
    format_version: int = FORMAT_VERSION
    end_of_text_id: int | None = None  # the separator written after every document
    text_bytes: int | None = None  # the documents' UTF-8 bytes (bits per byte = nats / (ln 2 x bytes))
    shards: list[Shard] | None = None  # a sharded split: its shards in order
    loss_mask: str | None = None  # the loss mask's file beside the stream; None: every token is a target
    trained_tokens: int | None = None  # tokens the mask marks (their text is `text_bytes`); None: all
    example_tokens: int | None = None  # the stream is whole examples of this many tokens; None: any cut

    @property
    def tokens_per_byte(self) -> float | None:
        """Tokens (separators included) per byte of text, of the trained tokens alone for a masked
        stream (`text_bytes` is then their text's); None where the manifest does not know."""
        tokens = self.trained_tokens if self.trained_tokens is not None else self.token_count
        return tokens / self.text_bytes if self.text_bytes else None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def manifest_path(tokens_path: str | Path) -> Path:
    """The manifest beside a token file; a sharded split's manifest is its own."""
    tokens_path = Path(tokens_path)
    if tokens_path.name.endswith(MANIFEST_SUFFIX):
        return tokens_path
    return tokens_path.with_name(tokens_path.name + MANIFEST_SUFFIX)


def write_manifest(tokens_path: str | Path, manifest: TokenFileManifest) -> Path:
    """Atomically: a reader never sees a half-written manifest."""
    return write_text_atomic(manifest_path(tokens_path), manifest.to_json())


def read_manifest(tokens_path: str | Path) -> TokenFileManifest | None:
    """The manifest beside a token file, or None for a bare stream."""
    path = manifest_path(tokens_path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("shards") is not None:
            data["shards"] = [Shard(**shard) for shard in data["shards"]]
        return TokenFileManifest(**data)
    except (json.JSONDecodeError, TypeError, UnicodeDecodeError, OSError, AttributeError) as error:
        raise DataError(f"{path}: unreadable token-file manifest ({error})") from None


@dataclass(frozen=True)
class TokenStream:
    """A 1-D array of token ids (a memmap for streams) and what is known about it."""

    path: Path
    tokens: np.ndarray
    manifest: TokenFileManifest | None
    mask: np.ndarray | None = None  # uint8, 1 where the token is a target (`loss_mask`); None: every one

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


class ShardedTokens:
    """A split's shards read as one 1-D array: slices and integer-array indexing, as a memmap gives."""

    def __init__(self, shards: list[np.ndarray]) -> None:
        self.shards = shards
        lengths = np.array([len(shard) for shard in shards], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(lengths)])
        self.dtype = shards[0].dtype
        self.shape = (int(self.starts[-1]),)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return self[np.arange(start, stop, step)]
            return self._range(start, stop)
        positions = np.asarray(index, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= len(self)):
            raise IndexError(f"token index out of range for a stream of {len(self)}")
        flat = positions.reshape(-1)
        which = np.searchsorted(self.starts, flat, side="right") - 1
        out = np.empty(flat.shape, dtype=self.dtype)
        for number in np.unique(which):
            chosen = which == number
            out[chosen] = self.shards[number][flat[chosen] - self.starts[number]]
        return out.reshape(positions.shape)

    def _range(self, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.empty(0, dtype=self.dtype)
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        last = int(np.searchsorted(self.starts, stop - 1, side="right")) - 1
        if first == last:  # the usual case: a view of one memmap, nothing copied
            offset = int(self.starts[first])
            return self.shards[first][start - offset : stop - offset]
        pieces = [
            self.shards[number][max(start - int(self.starts[number]), 0) : stop - int(self.starts[number])]
            for number in range(first, last + 1)
        ]
        return np.concatenate(pieces)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self._range(0, len(self))
        return whole if dtype is None else whole.astype(dtype)


def open_tokens(path: str | Path) -> TokenStream:
    """Open a token file (or a sharded split's manifest) for reading without loading it; checks size and
    dtype against the manifest, and a sharded split's shards against theirs."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: token file not found")
    if path.suffix == ".pt":
        return TokenStream(path, _load_pt(path), None)
    manifest = read_manifest(path)
    if path.name.endswith(MANIFEST_SUFFIX):
        if manifest is None or manifest.shards is None:
            raise DataError(f"{path}: a token-file manifest without shards; name its .bin file instead")
        return TokenStream(path, _open_shards(path, manifest), manifest)
    dtype = np.dtype(manifest.dtype if manifest else "uint16").newbyteorder("<")
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise DataError(f"{path}: {size} bytes is not a whole number of {dtype.name} tokens")
    count = size // dtype.itemsize
    if manifest and count != manifest.token_count:
        raise DataError(
            f"{path}: holds {count} {manifest.dtype} tokens but its manifest says {manifest.token_count}"
        )
    if count == 0:
        raise DataError(f"{path}: token file is empty")
    mask = _open_mask(path, manifest, count) if manifest is not None and manifest.loss_mask else None
    return TokenStream(path, np.memmap(path, dtype=dtype, mode="r"), manifest, mask)


def _open_mask(path: Path, manifest: TokenFileManifest, count: int) -> np.ndarray:
    """The loss mask a manifest names beside its stream: one uint8 a token."""
    mask = path.parent / str(manifest.loss_mask)
    if not mask.is_file():
        raise DataError(f"{mask}: the loss mask named by {manifest_path(path).name} is missing")
    if mask.stat().st_size != count:
        raise DataError(f"{mask}: {mask.stat().st_size} bytes, not one a token of {path.name} ({count})")
    return np.memmap(mask, dtype=np.uint8, mode="r")


def _open_shards(path: Path, manifest: TokenFileManifest) -> ShardedTokens:
    if not manifest.shards:
        raise DataError(f"{path}: the {manifest.split} split lists no shards")
    dtype = np.dtype(manifest.dtype).newbyteorder("<")
    arrays = []
    for entry in manifest.shards:
        shard = path.parent / entry.file
        if not shard.is_file():
            raise DataError(f"{shard}: shard named by {path.name} is missing")
        size = shard.stat().st_size
        if size != entry.tokens * dtype.itemsize:
            raise DataError(
                f"{shard}: {size} bytes, but {path.name} says {entry.tokens} {dtype.name} tokens "
                f"({entry.tokens * dtype.itemsize} bytes)"
            )
        if _sha256_of(str(shard), size, shard.stat().st_mtime_ns) != entry.sha256:
            raise DataError(f"{shard}: content differs from the sha256 {path.name} records")
        arrays.append(np.memmap(shard, dtype=dtype, mode="r"))
    total = sum(len(array) for array in arrays)
    if total != manifest.token_count:
        raise DataError(f"{path}: its shards hold {total} tokens but it says {manifest.token_count}")
    return ShardedTokens(arrays)


@cache
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    """Once per process for each version of a shard: the trainer, evaluation and the smoke open a split
    several times."""
    from gptcore.tools.fingerprint import sha256_file

    return sha256_file(path)


def _load_pt(path: Path) -> np.ndarray:
    import torch

    try:
        value = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many kinds for a bad file
        raise DataError(f"{path}: not a loadable .pt tensor file ({type(error).__name__})") from None
    if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.is_floating_point():
        raise DataError(f"{path}: expected a 1-D integer tensor of token ids")
    if value.numel() == 0:
        raise DataError(f"{path}: token file is empty")
    return value.numpy()


def check_vocabulary(stream: TokenStream, vocab_size: int, chunk: int = 1 << 24) -> None:
    """Refuse ids at or above the model's vocabulary before training starts (scans in chunks)."""
    if stream.manifest and stream.manifest.vocab_size > vocab_size:
        raise DataError(
            f"{stream.path}: tokenizer vocabulary {stream.manifest.vocab_size} exceeds the model's "
            f"vocab_size {vocab_size}"
        )
    highest = 0
    for start in range(0, len(stream), chunk):
        highest = max(highest, int(stream.tokens[start : start + chunk].max()))
    if highest >= vocab_size:
        raise DataError(
            f"{stream.path}: token id {highest} is outside the model's vocabulary (< {vocab_size})"
        )


def check_tokenizer(
    tokenizer_path: str | Path, vocab_size: int, streams: tuple[TokenStream, ...] = ()
) -> int:
    """Refuse a tokenizer whose vocabulary exceeds the model's, or that is not the one the token files'
    manifests were made with (by content sha256). Returns the tokenizer's vocabulary size."""
    from tokenizers import Tokenizer

    from gptcore.tools.fingerprint import sha256_file

    path = Path(tokenizer_path)
    if not path.is_file():
        raise DataError(f"{path}: tokenizer file not found")
    try:
        size = Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)
    except Exception:  # the Rust loader raises a bare Exception for any malformed file
        raise DataError(f"{path}: not a loadable tokenizer.json (malformed or not a tokenizer)") from None
    if size > vocab_size:
        raise DataError(f"{path}: tokenizer vocabulary {size} exceeds the model's vocab_size {vocab_size}")
    digest = sha256_file(path)
    for stream in streams:
        if stream.manifest and stream.manifest.tokenizer_sha256 not in ("", digest):
            raise DataError(
                f"{stream.path}: made with tokenizer sha256 {stream.manifest.tokenizer_sha256[:12]}..., "
                f"not {path} ({digest[:12]}...)"
            )
    return size


def find_test_tokens(tokenizer: Path, data_root: Path, other_than_corpus: str | None = None) -> Path | None:
    """The newest `test.bin` under `data_root/tokens/` made with `tokenizer` (by content sha256), or None:
    the held-out split a model trained with that tokenizer never saw; with `other_than_corpus`, not of
    the corpus with that fingerprint (a fine-tune's new text, encoded with its base's tokenizer)."""
    from gptcore.tools.fingerprint import sha256_file

    digest = sha256_file(tokenizer)
    return _newest_test_split(
        data_root,
        lambda _, manifest: (
            manifest.tokenizer_sha256 == digest
            and (other_than_corpus is None or manifest.corpus_fingerprint != other_than_corpus)
        ),
    )


def split_fingerprint(path: str | Path, manifest: TokenFileManifest | None = None) -> str:
    """The identity of a split's content (16 hex digits): its manifest's sha256 (a sharded split's is
    of its shards' sha256s), else the file's own. Two token folders holding the same test text give the
    same fingerprint, so figures measured on either compare."""
    from gptcore.tools.fingerprint import sha256_file

    manifest = manifest or read_manifest(path)
    return (manifest.sha256 if manifest is not None and manifest.sha256 else sha256_file(path))[:16]


def find_split(data_root: Path, fingerprint: str) -> Path | None:
    """The test split under `data_root/tokens/` whose content has `fingerprint` (`split_fingerprint`),
    or None: found by the manifests alone, so a token folder rebuilt under another name still is."""
    return _newest_test_split(
        data_root, lambda path, manifest: split_fingerprint(path, manifest) == fingerprint
    )


def _newest_test_split(data_root: Path, keep: Callable[[Path, TokenFileManifest], bool]) -> Path | None:
    """The newest test split under `data_root/tokens/` (a `test.bin`, or a sharded split's manifest)
    whose manifest `keep` accepts, or None."""
    found = []
    for path in [
        *Path(data_root).glob("tokens/*/test.bin"),
        *Path(data_root).glob("tokens/*/test.manifest.json"),
    ]:
        manifest = read_manifest(path)
        if manifest is not None and manifest.split == "test" and keep(path, manifest):
            found.append(path)
    return max(found, key=lambda path: path.stat().st_mtime, default=None)
