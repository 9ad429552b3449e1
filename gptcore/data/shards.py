"""A split's token shards as they are written: complete ones, and one open `.partial` file.

Shards hold `shard_tokens` tokens each (the last of a split the rest), cut wherever the count falls, so a
document may continue into the next shard exactly as it continues across examples. A document counts
in the shard holding its end-of-text id. A shard is synced and renamed from `<name>.partial` to
`<name>` when full; `state()` (after `sync()`) is what a resumed build needs to carry on with the open
shard cut back to what was synced: nothing past the last journal entry is ever trusted.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gptcore.errors import DataError
from gptcore.tools.records import JSONObject

PARTIAL = ".partial"


@dataclass(frozen=True)
class Shard:
    """One complete shard file of a split, as the folder manifest lists it (its keys the fields' names)."""

    file: str  # name inside the token folder
    tokens: int  # the ids it holds
    documents: int  # the documents whose end-of-text id it holds
    text_bytes: int  # those documents' UTF-8 bytes
    sha256: str  # the file's content

    def to_dict(self) -> dict[str, str | int]:
        return asdict(self)


@dataclass(frozen=True)
class OpenShard:
    """How far the open `.partial` shard had been synced."""

    tokens: int = 0  # ids written to it
    documents: int = 0  # documents ended in it
    text_bytes: int = 0  # their UTF-8 bytes


@dataclass(frozen=True)
class ShardsState:
    """A split's shards at a journal entry: what a resumed build carries on from."""

    shards: list[Shard] = field(default_factory=list)  # complete ones, in order
    open: OpenShard = field(default_factory=OpenShard)  # the one being written

    @classmethod
    def from_dict(cls, data: JSONObject) -> ShardsState:
        """From the journal's JSON (`asdict` wrote it)."""
        return cls([Shard(**shard) for shard in data["shards"]], OpenShard(**data["open"]))


def shard_name(split: str, number: int) -> str:
    return f"{split}-{number:06d}.bin"


class SplitShards:
    """Appends a split's ids to its shards in `folder`, resuming from a journal `state` when given."""

    def __init__(
        self, folder: Path, split: str, shard_tokens: int, dtype: str, state: ShardsState | None = None
    ) -> None:
        self.folder = folder
        self.split = split
        self.shard_tokens = shard_tokens
        self.itemsize = np.dtype(dtype).itemsize
        state = state or ShardsState()
        self.shards = list(state.shards)
        self.tokens = state.open.tokens
        self.documents = state.open.documents
        self.text_bytes = state.open.text_bytes
        self.digest = hashlib.sha256()
        self.handle = self._reopen()

    @property
    def _open_path(self) -> Path:
        return self.folder / (shard_name(self.split, len(self.shards)) + PARTIAL)

    def _reopen(self) -> Any:
        """The open shard cut back to the synced length, its hash read again; shards written after the
        journal's entry are removed."""
        path = self._open_path
        renamed = path.with_name(path.name.removesuffix(PARTIAL))
        if not path.exists() and renamed.exists():  # completed after the entry: take it back
            os.replace(renamed, path)
        for later in self.folder.glob(f"{self.split}-*.bin*"):
            number = int(later.name.split("-")[1].split(".")[0])
            if number > len(self.shards):
                later.unlink()
        length = self.tokens * self.itemsize
        if length and (not path.exists() or path.stat().st_size < length):
            raise DataError(f"{path}: shorter than its journal entry ({length} bytes)")
        handle = open(path, "r+b" if path.exists() else "w+b")  # noqa: SIM115 - kept open while appending
        handle.truncate(length)
        while chunk := handle.read(1 << 24):
            self.digest.update(chunk)
        handle.seek(length)
        return handle

    def append(self, ids: np.ndarray, lengths: np.ndarray, text_bytes: np.ndarray) -> None:
        """`ids` of whole documents (`lengths` tokens each, end-of-text included; `text_bytes` each)."""
        ends = np.cumsum(lengths, dtype=np.int64)
        counted = position = 0
        while position < len(ids):
            take = min(self.shard_tokens - self.tokens, len(ids) - position)
            chunk = ids[position : position + take]
            self.handle.write(chunk.data)
            self.digest.update(chunk.data)
            position += take
            ended = int(np.searchsorted(ends, position, side="right"))  # documents ending in this chunk
            self.documents += ended - counted
            self.text_bytes += int(text_bytes[counted:ended].sum())
            counted = ended
            self.tokens += take
            if self.tokens == self.shard_tokens:
                self._close()

    def _close(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        path = self._open_path
        os.replace(path, path.with_name(path.name.removesuffix(PARTIAL)))
        self.shards.append(
            Shard(
                path.name.removesuffix(PARTIAL),
                self.tokens,
                self.documents,
                self.text_bytes,
                self.digest.hexdigest(),
            )
        )
        self.tokens = self.documents = self.text_bytes = 0
        self.digest = hashlib.sha256()
        self.handle = open(self._open_path, "w+b")  # noqa: SIM115

    def sync(self) -> ShardsState:
        """Make the open shard durable and return the journal state that resumes from here."""
        self.handle.flush()
        os.fsync(self.handle.fileno())
        return ShardsState(list(self.shards), OpenShard(self.tokens, self.documents, self.text_bytes))

    def finish(self) -> list[Shard]:
        """Close the last shard (when it holds anything) and return every shard of the split."""
        if self.tokens:
            self._close()
        self.handle.close()
        self._open_path.unlink(missing_ok=True)
        return self.shards
