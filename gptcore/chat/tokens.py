"""A split of conversations as token files a fine-tune trains on: the token stream, its loss mask, and a
manifest (`gptcore.data.tokenfile`), laid out as whole examples.

Conversations are packed in their order into examples of `block_size + 1` tokens: each goes whole into
the current example while it fits, else starts the next one; the rest of an example is padding, never a
target. So an example never starts inside a conversation (an answer is always read after its question),
and the examples are the stream's windows exactly, as `gptcore.data.batches` cuts them. A conversation
longer than an example is left out and counted. Within an example, a conversation attends to the ones
packed before it (no attention mask between them): they are short, and the loss is on answers alone.

Each split's conversations are kept beside its tokens as JSON lines (`<split>.jsonl`): the held-out
questions are asked again from them (`gptcore.eval.answers`). The manifest's `text_bytes` are the
assistant's text (the answers' UTF-8 bytes) and `trained_tokens` the tokens the mask marks, so bits per
byte are the answers' (`gptcore.eval.held_out`)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from gptcore.chat.conversations import Conversation, write
from gptcore.chat.template import END_OF_TURN, encode
from gptcore.data.tokenfile import TokenFileManifest, dtype_for_vocab, write_manifest
from gptcore.errors import DataError
from gptcore.tools.atomic import publish_directory, staging_directory, write_json_atomic
from gptcore.tools.fingerprint import sha256_file
from gptcore.tools.records import JSONObject

MASK_SUFFIX = ".loss_mask.bin"
CONVERSATIONS_SUFFIX = ".jsonl"
FOLDER_MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Packed:
    """A split's examples, flat: ids, the loss mask (1: a target), and what went in."""

    ids: np.ndarray
    mask: np.ndarray
    conversations: int  # packed
    too_long: int  # left out: longer than an example
    answer_bytes: int  # the packed answers' UTF-8 bytes


def pack(conversations: Iterable[Conversation], tokenizer: Tokenizer, example_tokens: int) -> Packed:
    """The conversations' ids and masks packed into examples of `example_tokens` (see the module)."""
    pad = tokenizer.token_to_id(END_OF_TURN)
    ids: list[int] = []
    mask: list[bool] = []
    used = packed = too_long = answer_bytes = 0  # used: tokens in the current example

    def close() -> None:
        nonlocal used
        ids.extend([pad] * (example_tokens - used))
        mask.extend([False] * (example_tokens - used))
        used = 0

    for conversation in conversations:
        encoded = encode(tokenizer, conversation.messages)
        if len(encoded.ids) > example_tokens:
            too_long += 1
            continue
        if used + len(encoded.ids) > example_tokens:
            close()
        ids += encoded.ids
        mask += encoded.trained
        used += len(encoded.ids)
        packed += 1
        answer_bytes += sum(len(m.content.encode()) for m in conversation.messages if m.role == "assistant")
    if used:
        close()
    dtype = dtype_for_vocab(tokenizer.get_vocab_size(with_added_tokens=True))
    return Packed(np.array(ids, dtype=dtype), np.array(mask, dtype=np.uint8), packed, too_long, answer_bytes)


@dataclass(frozen=True)
class ChatSplit:
    """One split's files and counts, as the folder's manifest records them."""

    path: str  # the token stream (its loss mask and manifest beside it)
    conversations_path: str  # the split's conversations as JSON lines (all of them, packed or not)
    conversations: int
    too_long: int
    tokens: int
    trained_tokens: int
    answer_bytes: int


@dataclass(frozen=True)
class ChatTokenFolder:
    """A folder of conversation token files: each split's, and what made them."""

    directory: str
    source_fingerprint: str
    tokenizer_sha256: str
    example_tokens: int
    splits: dict[str, ChatSplit]

    def to_dict(self) -> JSONObject:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: JSONObject) -> ChatTokenFolder:
        splits = {name: ChatSplit(**split) for name, split in data["splits"].items()}
        return cls(**{**data, "splits": splits})


def build_chat_tokens(
    splits: dict[str, Iterable[Conversation]],
    tokenizer_path: Path,
    folder: Path,
    source_fingerprint: str,
    example_tokens: int,
) -> ChatTokenFolder:
    """Each split packed (`pack`) into `folder`: `<split>.bin`, its loss mask and manifest, and the
    folder's `manifest.json`; the folder appears whole or not at all (an earlier one stays until then)."""
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer_sha256 = sha256_file(tokenizer_path)
    written: dict[str, ChatSplit] = {}
    with staging_directory(folder) as staging:
        for split, conversations in splits.items():
            items = list(conversations)
            write(items, staging / f"{split}{CONVERSATIONS_SUFFIX}")  # what was asked, to ask again
            packed = pack(items, tokenizer, example_tokens)
            if packed.conversations == 0:
                raise DataError(
                    f"the {split} split holds no conversation that fits an example of {example_tokens} "
                    f"tokens ({packed.too_long} longer)"
                )
            _write_split(
                packed, staging, split, tokenizer, tokenizer_sha256, source_fingerprint, example_tokens
            )
            written[split] = ChatSplit(
                str(folder / f"{split}.bin"),
                str(folder / f"{split}{CONVERSATIONS_SUFFIX}"),
                packed.conversations,
                packed.too_long,
                len(packed.ids),
                int(packed.mask.sum()),
                packed.answer_bytes,
            )
        record = ChatTokenFolder(str(folder), source_fingerprint, tokenizer_sha256, example_tokens, written)
        write_json_atomic(staging / FOLDER_MANIFEST, record.to_dict())
        publish_directory(staging, folder)
    return record


def _write_split(
    packed: Packed,
    folder: Path,
    split: str,
    tokenizer: Tokenizer,
    tokenizer_sha256: str,
    source_fingerprint: str,
    example_tokens: int,
) -> None:
    stream, mask = folder / f"{split}.bin", folder / f"{split}{MASK_SUFFIX}"
    ids = packed.ids.astype(packed.ids.dtype.newbyteorder("<")).tobytes()
    stream.write_bytes(ids)
    mask.write_bytes(packed.mask.tobytes())
    # The split's identity covers its loss mask too: the same tokens trained on other positions differ.
    digest = hashlib.sha256(hashlib.sha256(ids).digest() + hashlib.sha256(packed.mask.tobytes()).digest())
    manifest = TokenFileManifest(
        dtype=str(packed.ids.dtype),
        token_count=len(packed.ids),
        document_count=packed.conversations,
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        tokenizer_sha256=tokenizer_sha256,
        corpus_fingerprint=source_fingerprint,
        split=split,
        sha256=digest.hexdigest(),
        text_bytes=packed.answer_bytes,
        loss_mask=mask.name,
        trained_tokens=int(packed.mask.sum()),
        example_tokens=example_tokens,
    )
    write_manifest(stream, manifest)
