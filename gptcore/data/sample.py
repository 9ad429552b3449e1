"""The tokenizer's sample: a bounded, seeded part of the train split, whatever the corpus's size.

Units (a few megabytes of the source each) are read in an order shuffled from `sample_seed`, and their
train documents kept until `sample_bytes` of text: the sample spreads over the whole corpus and costs
about `sample_bytes` of reading, so tokenizer training costs the same for 1 GB and 100 GB. A corpus
smaller than the budget gives its whole train split. A stream (no units known ahead) gives its first
train documents. The sample's size and sha256 go into the tokenizer's manifest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import numpy as np

from gptcore.data.corpus import Corpus
from gptcore.data.documents import split_documents
from gptcore.tools.records import known_fields


@dataclass(frozen=True)
class SampleRecord:
    """What the tokenizer's manifest records of its sample (its keys the fields' names; a manifest
    written before the sample was recorded has none: every field None)."""

    sample_documents: int | None = None  # train documents read
    sample_bytes: int | None = None  # their UTF-8 bytes
    sample_units: int | None = None  # units of the corpus they came from
    sample_sha256: str | None = None  # of the documents' hashes in the order read
    sample_is_whole_train_split: bool | None = None  # every train document of the corpus is in it

    def to_dict(self) -> dict[str, str | int | bool]:
        return {key: value for key, value in asdict(self).items() if value is not None}

    @classmethod
    def from_dict(cls, data: dict[str, str | int | bool]) -> SampleRecord:
        return cls(**known_fields(cls, data))


@dataclass
class Sample:
    """What the sample held, filled in as it is read."""

    budget: int
    documents: int = 0
    bytes: int = 0
    units: int = 0
    whole_split: bool = False  # every train document of the corpus is in it
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)

    @property
    def sha256(self) -> str:
        return self.digest.hexdigest()

    def record(self) -> SampleRecord:
        return SampleRecord(self.documents, self.bytes, self.units, self.sha256, self.whole_split)


def sample_texts(corpus: Corpus, budget: int, seed: int, sample: Sample) -> Iterator[list[str]]:
    """Batches of train documents, until `budget` bytes of text; `sample` records what was read."""
    batch: list[str] = []
    for document in _train_documents(corpus, seed, sample):
        batch.append(document.text)
        sample.documents += 1
        sample.bytes += len(document.data)
        sample.digest.update(hashlib.sha256(document.data).digest())
        if len(batch) >= 256:
            yield batch
            batch = []
        if sample.bytes >= budget:
            break
    else:
        sample.whole_split = True
    if batch:
        yield batch


def _train_documents(corpus: Corpus, seed: int, sample: Sample) -> Iterator:
    for unit in _units_in_sample_order(corpus, seed):
        sample.units += 1
        for split, document in split_documents(unit, corpus.reading):
            if split == "train":
                yield document


def _units_in_sample_order(corpus: Corpus, seed: int) -> Iterator:
    if corpus.planned is None:
        yield from corpus.units()
        return
    for index in np.random.default_rng([seed, len(corpus.planned)]).permutation(len(corpus.planned)):
        yield corpus.planned[int(index)]
