"""Encoders for token building: tiktoken built from the trained merges, or HF `encode_batch_fast`.

A tiktoken `Encoding` with the trained vocabulary as merge ranks and GPT-2's pre-tokenizer pattern
encodes the same byte-level BPE several times faster than `tokenizers`. It is only offered when the
tokenizer's structure is the one it reproduces (byte-level pre-tokenizer with the GPT-2 regex, no
normalizer, plain BPE whose merge order is its id order, special tokens only as added tokens); the
build also compares a sample of documents with `encode_batch_fast` and falls back to it on any
difference, and `bench/data_throughput.py` compares every document of the corpus.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Protocol

import numpy as np
from tokenizers import Tokenizer

from gptcore.errors import ConfigError

# tokenizers' ByteLevel pre-tokenizer regex (src/pre_tokenizers/byte_level.rs), GPT-2's pattern.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


class Encoder(Protocol):
    name: str
    threads: int  # calling threads the build runs it on
    slice_characters: int  # about how much text one call gets

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """One uint32 id array per text, exactly as `Tokenizer.encode_batch_fast` gives them."""
        ...


def workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


class HFEncoder:
    """The reference: `Tokenizer.encode_batch_fast` (Rust, on all cores, no offsets)."""

    name = "tokenizers"
    # The Rust side spreads each batch over every core; a second calling thread keeps them busy
    # while the first turns its ids into arrays under the GIL.
    threads = 2
    # Rayon balances documents only within one call: large slices keep a big document from idling a core.
    slice_characters = 1 << 22

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encodings = self.tokenizer.encode_batch_fast(list(texts))
        return [np.asarray(encoding.ids, dtype=np.uint32) for encoding in encodings]


class TiktokenEncoder:
    """tiktoken's Rust BPE; it releases the GIL, so the build runs one calling thread per core."""

    name = "tiktoken"
    threads = workers()
    slice_characters = 1 << 20

    def __init__(self, tokenizer_path: str | Path) -> None:
        import tiktoken

        spec = json.loads(Path(tokenizer_path).read_text(encoding="utf-8"))
        reason = why_not_tiktoken(spec)
        if reason:
            raise ConfigError(f"encoder 'tiktoken': it cannot reproduce {tokenizer_path} ({reason})")
        decode = byte_decoder()
        specials = {added["content"]: added["id"] for added in spec["added_tokens"]}
        ranks = {
            bytes(decode[char] for char in token): rank
            for token, rank in spec["model"]["vocab"].items()
            if token not in specials
        }
        self.encoding = tiktoken.Encoding(
            f"gptpipe-{Path(tokenizer_path).parent.name}",
            pat_str=GPT2_PATTERN,
            mergeable_ranks=ranks,
            special_tokens=specials,
        )

    def encode(self, text: str) -> np.ndarray:
        # Special tokens written in the text become their ids, as the HF tokenizer's added tokens do.
        return self.encoding.encode_to_numpy(text, allowed_special="all")

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [self.encode(text) for text in texts]


@cache
def byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    characters = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    return {chr(character): byte for byte, character in zip(printable, characters, strict=True)}


def why_not_tiktoken(spec: dict) -> str | None:
    """None when tiktoken's algorithm is the one this tokenizer.json describes, else the reason."""
    pre = spec.get("pre_tokenizer") or {}
    model = spec.get("model") or {}
    checks = [
        (spec.get("normalizer") is None, "it has a normalizer"),
        (pre.get("type") == "ByteLevel", "its pre-tokenizer is not ByteLevel"),
        (pre.get("use_regex") is True and pre.get("add_prefix_space") is False, "ByteLevel options differ"),
        (model.get("type") == "BPE", "its model is not BPE"),
        (model.get("dropout") is None and model.get("unk_token") is None, "BPE dropout or unk token set"),
        (
            not model.get("continuing_subword_prefix") and not model.get("end_of_word_suffix"),
            "subword affixes",
        ),
        (not model.get("byte_fallback") and not model.get("ignore_merges"), "byte fallback or ignore_merges"),
        (all(added.get("special") for added in spec.get("added_tokens", [])), "non-special added tokens"),
    ]
    for holds, reason in checks:
        if not holds:
            return reason
    return _merge_order_problem(model, spec.get("added_tokens", []))


def _merge_order_problem(model: dict, added_tokens: list[dict]) -> str | None:
    """tiktoken ranks a pair by the id of what it makes; HF by the merge's position: they must agree."""
    specials = {added["content"] for added in added_tokens}
    vocab = {token: rank for token, rank in model["vocab"].items() if token not in specials}
    decode = byte_decoder()
    if any(char not in decode for token in vocab for char in token):
        return "a vocabulary entry is not byte-level text"
    previous = -1
    made_by_merges = set()
    for merge in model["merges"]:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        made = vocab.get(left + right)
        if made is None or made <= previous:
            return f"merge {left!r} + {right!r} does not follow id order"
        previous = made
        made_by_merges.add(left + right)
    # tiktoken would use any multi-byte entry as a merge result; HF only reaches those merges make.
    if {token for token in vocab if len(token) > 1} != made_by_merges:
        return "some vocabulary entries are not made by a merge"
    return None


def make_encoder(tokenizer_path: str | Path, prefer: str = "auto") -> Encoder:
    """tiktoken when it reproduces the tokenizer (or is asked for), else `encode_batch_fast`."""
    if prefer not in ("auto", "tiktoken", "tokenizers"):
        raise ConfigError(f"encoder {prefer!r} is not allowed: expected auto, tiktoken or tokenizers")
    if prefer != "tokenizers":
        spec = json.loads(Path(tokenizer_path).read_text(encoding="utf-8"))
        if prefer == "tiktoken" or why_not_tiktoken(spec) is None:
            return TiktokenEncoder(tokenizer_path)
    return HFEncoder(Tokenizer.from_file(str(tokenizer_path)))


def first_difference(texts: Sequence[str], encoded: Sequence[np.ndarray], reference: Encoder) -> int | None:
    """Index of the first text whose ids differ from the reference encoder's, or None."""
    for index, (mine, theirs) in enumerate(zip(encoded, reference.encode_batch(texts), strict=True)):
        if not np.array_equal(mine, theirs):
            return index
    return None
