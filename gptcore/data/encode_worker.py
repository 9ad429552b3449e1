"""One encoding worker: reads a unit from disk, splits its documents, encodes them, hands back the ids.

A worker process holds one encoder (tiktoken or the `tokenizers` reference, built once by `start`) and
returns per split the unit's ids with each document followed by the end-of-text id, plus a record of
every document in source order (its split, tokens and bytes): the parent needs those to cut shards and
budgets at document boundaries, exactly where one worker would have cut them.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gptcore.data.documents import SPLITS, Reading, Unit, split_documents
from gptcore.errors import DataError

if TYPE_CHECKING:  # the encoders load with the worker (`start`), not with this module
    from gptcore.data.encoders import Encoder

VERIFY_MAX_CHARACTERS = 1 << 16
DOCUMENT_RECORD = np.dtype([("split", "u1"), ("tokens", "<u4"), ("bytes", "<u8"), ("replaced", "<u4")])


class EncoderMismatch(Exception):
    """The fast encoder gave other ids than the reference on a checked document."""


@dataclass(frozen=True)
class EncodeSettings:
    tokenizer_path: str
    encoder: str  # auto | tiktoken | tokenizers
    verify_fraction: float
    end_of_text_id: int
    vocab_size: int
    dtype: str
    reading: Reading


@dataclass
class UnitTokens:
    """A unit encoded: the ids of each split and one `DOCUMENT_RECORD` per non-empty document."""

    index: int
    ids: dict[str, np.ndarray]
    documents: np.ndarray
    empty: int
    verified: int
    source_bytes: int
    encoder: str


@dataclass(frozen=True)
class _Worker:
    """What `start` built in this process, for each unit it encodes."""

    settings: EncodeSettings
    encoder: Encoder  # the chosen encoder
    reference: Encoder | None  # encode_batch_fast, to check a fast encoder against; None: the one chosen


_state: list[_Worker] = []  # this process's, once started


def start(settings: EncodeSettings, in_process: bool = False) -> None:
    """Build the encoder (once per worker process; `in_process` for a build without workers)."""
    from tokenizers import Tokenizer

    from gptcore.data.encoders import HFEncoder, make_encoder

    if not in_process:
        from gptcore.tools.processes import on_parent_death

        on_parent_death(signal.SIGKILL)  # nothing here to save: the parent's journal holds the progress
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core each: the processes are the parallelism
    reference = HFEncoder(Tokenizer.from_file(settings.tokenizer_path))
    chosen = (
        reference
        if settings.encoder == "tokenizers"
        else make_encoder(settings.tokenizer_path, settings.encoder)
    )
    _state[:] = [_Worker(settings, chosen, reference if chosen is not reference else None)]


def encoder_name() -> str:
    return _state[0].encoder.name


def encode_unit(unit: Unit) -> UnitTokens:
    worker = _state[0]
    settings, encoder, reference = worker.settings, worker.encoder, worker.reference
    texts: dict[str, list[str]] = {split: [] for split in SPLITS}
    records: list[tuple[int, int, int, int]] = []
    empty = 0
    for split, document in split_documents(unit, settings.reading):
        if split is None:
            empty += 1
            continue
        texts[split].append(document.text)
        records.append((SPLITS.index(split), 0, len(document.data), document.replaced))
    documents = np.array(records, dtype=DOCUMENT_RECORD)
    ids: dict[str, np.ndarray] = {}
    verified = 0
    for number, split in enumerate(SPLITS):
        arrays = encoder.encode_batch(texts[split]) if texts[split] else []
        if reference is not None and settings.verify_fraction > 0:
            verified += _verify(unit.index, number, texts[split], arrays, reference, settings.verify_fraction)
        ids[split] = _join(arrays, settings.end_of_text_id, settings.dtype)
        documents["tokens"][documents["split"] == number] = [len(array) + 1 for array in arrays]
        if len(ids[split]) and int(ids[split].max()) >= settings.vocab_size:
            raise DataError(
                f"{settings.tokenizer_path}: encoder produced id {int(ids[split].max())} outside the "
                f"vocabulary {settings.vocab_size} (unit {unit.index})"
            )
    return UnitTokens(unit.index, ids, documents, empty, verified, unit.size, encoder.name)


def _join(arrays: list[np.ndarray], end_of_text_id: int, dtype: str) -> np.ndarray:
    """The documents' ids, each followed by the end-of-text id, as one little-endian array of `dtype`."""
    out = np.empty(sum(len(array) for array in arrays) + len(arrays), dtype=np.dtype(dtype).newbyteorder("<"))
    position = 0
    for array in arrays:
        out[position : position + len(array)] = array
        position += len(array)
        out[position] = end_of_text_id
        position += 1
    return out


def _verify(
    unit: int, split: int, texts: list[str], arrays: list[np.ndarray], reference: Any, fraction: float
) -> int:
    """Compare a deterministic spread of documents with the reference (the largest skipped: the
    reference encodes one document on one core; the benchmark compares every document)."""
    from gptcore.data.encoders import first_difference

    modulus = 10007
    chosen = [
        offset
        for offset, text in enumerate(texts)
        if ((unit * 3 + split) * 1_000_003 + offset) * 2654435761 % modulus < fraction * modulus
        and len(text) <= VERIFY_MAX_CHARACTERS
    ]
    if not chosen:
        return 0
    wrong = first_difference([texts[i] for i in chosen], [arrays[i] for i in chosen], reference)
    if wrong is not None:
        raise EncoderMismatch(f"unit {unit}, {SPLITS[split]} document {chosen[wrong]} encodes differently")
    return len(chosen)
