"""Token files: the corpus encoded by worker processes into shards, resumable after any kill.

`<data_root>/tokens/<fingerprint>/` holds, per split, shards `train-000000.bin`, ... of `shard_tokens`
flat little-endian ids (uint16 when the vocabulary fits, else uint32; every document followed by the
end-of-text id), the split's manifest `train.manifest.json` listing them (what trainers open), and the
folder's `manifest.json`.

How it stays bounded, parallel and resumable:
- The corpus comes as units of a few megabytes (`gptcore.data.corpus`); `data.workers` processes each
  read, split and encode whole units (`gptcore.data.encode_worker`), at most two per worker in flight.
- The parent appends the units' ids in unit order, cutting shards by count and budgets at document
  boundaries: the shards are a function of the corpus and the tokenizer alone, whatever the workers.
- Everything is written in `.<fingerprint>.building/` beside the final folder. Every couple of
  seconds the open shards are synced and `progress.json` records how far the units went; killed at
  any moment, the same call carries on from there (units after the entry are encoded again, shards
  past it removed) and ends with the same bytes. The folder is renamed into place when complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from filelock import FileLock

from gptcore.data import encode_worker
from gptcore.data.config import DataConfig
from gptcore.data.corpus import Corpus, SourceRecord, SplitStats
from gptcore.data.documents import SPLITS
from gptcore.data.encode_worker import EncoderMismatch, EncodeSettings, UnitTokens
from gptcore.data.encoders import workers as cores
from gptcore.data.progress import DataProgress
from gptcore.data.shards import Shard, ShardsState, SplitShards
from gptcore.data.tokenfile import FORMAT_VERSION, TokenFileManifest, dtype_for_vocab, write_manifest
from gptcore.data.tokenizer import TokenizerManifest
from gptcore.errors import ConfigError, DataError, DiskFullError
from gptcore.tools.atomic import publish_directory, remove_abandoned, write_json_atomic
from gptcore.tools.disk_space import free_bytes, is_disk_full, megabytes
from gptcore.tools.fingerprint import code_version_of, fingerprint
from gptcore.tools.records import JSONObject, known_fields

ENCODERS = ("auto", "tiktoken", "tokenizers")
FOLDER_MANIFEST = "manifest.json"
JOURNAL = "progress.json"
VERIFY_FRACTION = 0.02  # share of documents the fast encoder is checked on against encode_batch_fast
JOURNAL_EVERY_SECONDS = 2.0  # at most this much encoding is done again after a kill


@dataclass(frozen=True)
class SplitTokens:
    """One split in the folder: its manifest (the path trainers open), its shards and its counts."""

    split: str
    path: str  # <folder>/<split>.manifest.json
    manifest_path: str
    sha256: str  # of the shards' sha256s in order: one digest for the split
    tokens: int
    documents: int
    text_bytes: int = 0  # the split's documents in UTF-8: the denominator of bits per byte
    replaced_bytes: int = 0  # bytes of invalid UTF-8 replaced in its documents
    shards: list[Shard] = field(default_factory=list)  # in order

    @classmethod
    def from_dict(cls, data: JSONObject) -> SplitTokens:
        return cls(**{**data, "shards": [Shard(**shard) for shard in data.get("shards", [])]})


@dataclass(frozen=True)
class Budget:
    """The limits a build ran under (None: none), and whether they cut the source short."""

    max_documents: int | None = None  # corpus.max_documents
    max_bytes: int | None = None  # corpus.max_bytes
    max_tokens: int | None = None  # data.max_tokens: train tokens
    cut_the_source: bool = False  # a limit was reached before the source ended


@dataclass(frozen=True)
class TokenFolderManifest:
    """The token folder's `manifest.json`: how it was built, what the budgets kept, and its splits."""

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
    code_version: str = ""
    shard_tokens: int = 0
    workers: int = 1
    empty_documents_skipped: int = 0
    source: SourceRecord | None = None  # the corpus (on disk {} where a build recorded none)
    budget: Budget | None = None  # the limits, and whether they cut the source (the same)
    resumed_at_unit: int = 0  # 0: built from the start

    @property
    def train(self) -> SplitTokens:
        return self.files["train"]

    @property
    def validation(self) -> SplitTokens:
        return self.files["validation"]

    @property
    def test(self) -> SplitTokens:
        return self.files["test"]

    def to_dict(self) -> JSONObject:
        return {**asdict(self), "source": _or_empty(self.source), "budget": _or_empty(self.budget)}

    @classmethod
    def from_dict(cls, data: JSONObject) -> TokenFolderManifest:
        files = {name: SplitTokens.from_dict(value) for name, value in data["files"].items()}
        source = SourceRecord(**data["source"]) if data.get("source") else None
        budget = Budget(**known_fields(Budget, data["budget"])) if data.get("budget") else None
        return cls(**{**data, "files": files, "source": source, "budget": budget})


def _or_empty(record: SourceRecord | Budget | None) -> dict[str, object]:
    return asdict(record) if record is not None else {}


@dataclass
class Journal:
    """`progress.json`: how far an unfinished build went, what a resumed one carries on from."""

    key: str  # the folder's fingerprint
    encoder_asked: str  # the encoder the build was asked for (a build asked for another starts over)
    encoder: str  # the one encoding
    next_unit: int = 0  # the first unit not yet appended
    cut: bool = False  # a budget ended the source
    tally: Tally = field(default_factory=lambda: Tally())  # what was kept up to `next_unit`
    splits: dict[str, ShardsState] = field(default_factory=dict)  # each split's shards then

    @classmethod
    def from_dict(cls, data: JSONObject) -> Journal:
        splits = {split: ShardsState.from_dict(state) for split, state in data["splits"].items()}
        return cls(**{**data, "tally": Tally(**data["tally"]), "splits": splits})


def _code_version() -> str:
    import gptcore.data.build
    import gptcore.data.encode_worker
    import gptcore.data.encoders
    import gptcore.data.shards
    import gptcore.data.tokenfile

    return code_version_of(
        gptcore.data.build,
        gptcore.data.encoders,
        gptcore.data.encode_worker,
        gptcore.data.shards,
        gptcore.data.tokenfile,
    )


def token_files_fingerprint(
    corpus_fingerprint: str, tokenizer: TokenizerManifest, data: DataConfig | None = None
) -> str:
    """Corpus + tokenizer (by fingerprint and content) + shard size and budget + this code and format:
    what decides the files (the number of workers does not)."""
    data = data or DataConfig()
    layout = {"shard_tokens": data.shard_tokens, "max_tokens": data.max_tokens}
    return fingerprint(
        "tokens",
        corpus_fingerprint,
        tokenizer.fingerprint,
        tokenizer.sha256,
        layout,
        _code_version(),
        FORMAT_VERSION,
    )


# --- encoding units in worker processes, handed back in unit order ----------------------------------


@contextlib.contextmanager
def encoding(settings: EncodeSettings, workers: int) -> Iterator[Callable[[Iterable], Iterator[UnitTokens]]]:
    """`encode(units)` yields each unit's `UnitTokens` in unit order; one worker encodes in this process."""
    if workers == 1:
        encode_worker.start(settings, in_process=True)
        yield lambda units: (encode_worker.encode_unit(unit) for unit in units)
        return
    pool = ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),  # the parent may hold threads and CUDA: never fork
        initializer=encode_worker.start,
        initargs=(settings,),
    )
    try:
        yield lambda units: _in_order(pool, units, 2 * workers)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # at most the units already started finish


def _in_order(pool: ProcessPoolExecutor, units: Iterable, window: int) -> Iterator[UnitTokens]:
    pending: deque[Future] = deque()
    for unit in units:
        pending.append(pool.submit(encode_worker.encode_unit, unit))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


# --- budgets ----------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What the build has kept so far, in source order: what budgets and statistics read."""

    documents: int = 0
    text_bytes: int = 0
    train_tokens: int = 0
    source_bytes: int = 0
    tokens: int = 0
    empty: int = 0
    verified: int = 0
    splits: dict[str, list[int]] = field(default_factory=lambda: {split: [0, 0, 0] for split in SPLITS})


def _kept(documents: np.ndarray, tally: Tally, corpus: Corpus, data: DataConfig) -> int:
    """How many of a unit's documents the budgets keep: each limit keeps documents until it is reached."""
    keep = len(documents)
    cfg = corpus.cfg
    if cfg.max_documents is not None:
        keep = min(keep, max(cfg.max_documents - tally.documents, 0))
    limits = [
        (cfg.max_bytes, tally.text_bytes, documents["bytes"].astype(np.int64)),
        (data.max_tokens, tally.train_tokens, np.where(documents["split"] == 0, documents["tokens"], 0)),
    ]
    for limit, before, sizes in limits:
        if limit is not None:
            reached = before + np.cumsum(sizes, dtype=np.int64) >= limit
            keep = min(keep, int(np.argmax(reached)) + 1 if reached.any() else keep)
    return keep


# --- the stage ------------------------------------------------------------------------------------


def build_token_files(
    corpus: Corpus,
    tokenizer: TokenizerManifest,
    data_root: Path,
    *,
    data: DataConfig | None = None,
    encoder: str = "auto",
    verify_fraction: float = VERIFY_FRACTION,
) -> TokenFolderManifest:
    """Encode train, validation and test into shards under `<data_root>/tokens/<fingerprint>/`.

    `encoder`: `auto` (tiktoken where it reproduces the tokenizer, else `encode_batch_fast`),
    `tiktoken` or `tokenizers`. A fast encoder is checked on `verify_fraction` of the documents against
    `encode_batch_fast`; on any difference the build starts over with `encode_batch_fast`.
    A build of the same folder left unfinished (killed) is carried on from its journal.
    """
    if encoder not in ENCODERS:
        raise ConfigError(f"encoder {encoder!r} is not allowed: expected one of {', '.join(ENCODERS)}")
    data = data or DataConfig()
    key = token_files_fingerprint(corpus.fingerprint, tokenizer, data)
    final = Path(data_root).resolve() / "tokens" / key
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(final.parent, key)
    building = final.with_name(f".{key}.building")
    with FileLock(str(final.with_name(f".{key}.lock"))), _out_of_space(final, building):
        build = _Build(corpus, tokenizer, data, building, final, key, verify_fraction)
        try:
            return build.run(encoder)
        except EncoderMismatch as mismatch:
            shutil.rmtree(building, ignore_errors=True)
            fallback = f"{build.encoder_name}: {mismatch}; rebuilt with tokenizers"
            return _Build(corpus, tokenizer, data, building, final, key, 0.0, fallback).run("tokenizers")


class _Build:
    """One run of the build: the journal, the shard writers, the loop over units."""

    def __init__(
        self,
        corpus: Corpus,
        tokenizer: TokenizerManifest,
        data: DataConfig,
        building: Path,
        final: Path,
        key: str,
        verify_fraction: float,
        fallback: str | None = None,
    ) -> None:
        self.corpus, self.tokenizer, self.data = corpus, tokenizer, data
        self.building, self.final, self.key = building, final, key
        self.verify_fraction = verify_fraction
        self.fallback = fallback
        self.dtype = dtype_for_vocab(tokenizer.vocab_size)
        self.workers = data.workers or cores()
        self.encoder_name = ""

    def run(self, encoder: str) -> TokenFolderManifest:
        started = time.perf_counter()
        journal = self._journal(encoder)
        self.encoder_name = journal.encoder if journal.encoder != "auto" else expected_encoder(self.tokenizer)
        tally = journal.tally
        resumed_at = journal.next_unit
        writers = {
            split: SplitShards(
                self.building, split, self.data.shard_tokens, self.dtype, journal.splits.get(split)
            )
            for split in SPLITS
        }
        settings = EncodeSettings(
            tokenizer_path=self.tokenizer.path,
            encoder=journal.encoder_asked,
            verify_fraction=self.verify_fraction,
            end_of_text_id=self.tokenizer.end_of_text_id,
            vocab_size=self.tokenizer.vocab_size,
            dtype=self.dtype,
            reading=self.corpus.reading,
        )
        progress = DataProgress("tokens", self.corpus.source_bytes, tally.source_bytes)
        new_tokens = 0
        last_entry = time.perf_counter()
        try:
            with encoding(settings, self.workers) as encode:
                for result in encode([] if journal.cut else self.corpus.units(skip=resumed_at)):
                    journal.encoder = self.encoder_name = result.encoder
                    cut = self._append(result, tally, writers)
                    new_tokens += sum(len(ids) for ids in result.ids.values())
                    journal.next_unit = result.index + 1
                    progress.update(tally.documents, tally.source_bytes, tally.tokens, new_tokens)
                    if result.index == resumed_at:
                        self._check_space(tally)
                    if cut or time.perf_counter() - last_entry >= JOURNAL_EVERY_SECONDS:
                        self._write_journal(journal, tally, writers)
                        last_entry = time.perf_counter()
                    if cut:
                        journal.cut = True
                        break
        finally:
            progress.close()
        return self._finish(journal, tally, writers, started, resumed_at, new_tokens)

    # -- the journal --

    def _journal(self, encoder: str) -> Journal:
        """The entry of an unfinished build of this folder, or a fresh folder and entry."""
        path = self.building / JOURNAL
        if path.is_file():
            with contextlib.suppress(json.JSONDecodeError, OSError, KeyError, TypeError, AttributeError):
                entry = Journal.from_dict(json.loads(path.read_text(encoding="utf-8")))
                if entry.key == self.key and entry.encoder_asked == encoder:
                    return entry
        shutil.rmtree(self.building, ignore_errors=True)
        self.building.mkdir(parents=True)
        return Journal(self.key, encoder, encoder)

    def _write_journal(self, journal: Journal, tally: Tally, writers: dict[str, SplitShards]) -> None:
        journal.splits = {split: writer.sync() for split, writer in writers.items()}
        journal.tally = tally
        write_json_atomic(self.building / JOURNAL, asdict(journal))

    # -- one unit --

    def _append(self, result: UnitTokens, tally: Tally, writers: dict[str, SplitShards]) -> bool:
        """Append a unit's kept documents to the shards; True when a budget ended the source here."""
        documents = result.documents
        keep = _kept(documents, tally, self.corpus, self.data)
        kept = documents[:keep]
        for number, split in enumerate(SPLITS):
            mine = kept[kept["split"] == number]
            lengths = mine["tokens"].astype(np.int64)
            ids = result.ids[split][: int(lengths.sum())]
            writers[split].append(ids, lengths, mine["bytes"])
            counts = tally.splits[split]
            counts[0] += len(mine)
            counts[1] += int(mine["bytes"].sum())
            counts[2] += int(mine["replaced"].sum())
            tally.tokens += len(ids)
            if split == "train":
                tally.train_tokens += len(ids)
        tally.documents += keep
        tally.text_bytes += int(kept["bytes"].sum())
        tally.source_bytes += result.source_bytes
        tally.empty += result.empty
        tally.verified += result.verified
        return keep < len(documents) or self._budget_reached(tally)

    def _budget_reached(self, tally: Tally) -> bool:
        cfg, data = self.corpus.cfg, self.data
        return (
            (cfg.max_documents is not None and tally.documents >= cfg.max_documents)
            or (cfg.max_bytes is not None and tally.text_bytes >= cfg.max_bytes)
            or (data.max_tokens is not None and tally.train_tokens >= data.max_tokens)
        )

    def _check_space(self, tally: Tally) -> None:
        """After the first unit: the tokens per source byte it gave, times what is left of the source,
        against the free space; refused in one line (the journal kept) when it will not fit."""
        total = self.corpus.source_bytes
        if not total or not tally.source_bytes:
            return
        itemsize = np.dtype(self.dtype).itemsize
        needed = int(tally.tokens / tally.source_bytes * (total - tally.source_bytes) * itemsize * 1.1)
        free = free_bytes(self.building)
        if free is not None and needed > free:
            raise DiskFullError(
                f"{self.final}: the token files need about {megabytes(needed)} more, {megabytes(free)} are "
                f"free there; free space and run again (what is written is kept in {self.building.name})"
            )

    # -- the end --

    def _finish(
        self,
        journal: Journal,
        tally: Tally,
        writers: dict[str, SplitShards],
        started: float,
        resumed_at: int,
        new_tokens: int,
    ) -> TokenFolderManifest:
        stats = self._stats(tally)
        files = {}
        for split, writer in writers.items():
            shards = writer.finish()
            digest = hashlib.sha256("".join(shard.sha256 for shard in shards).encode()).hexdigest()
            files[split] = SplitTokens(
                split=split,
                path=str(self.final / f"{split}.manifest.json"),
                manifest_path=str(self.final / f"{split}.manifest.json"),
                sha256=digest,
                tokens=sum(shard.tokens for shard in shards),
                documents=stats[split].documents,
                text_bytes=stats[split].bytes,
                replaced_bytes=stats[split].replaced_bytes,
                shards=shards,
            )
        seconds = time.perf_counter() - started
        manifest = TokenFolderManifest(
            fingerprint=self.key,
            corpus_fingerprint=self.corpus.fingerprint,
            tokenizer_fingerprint=self.tokenizer.fingerprint,
            tokenizer_sha256=self.tokenizer.sha256,
            directory=str(self.final),
            dtype=self.dtype,
            vocab_size=self.tokenizer.vocab_size,
            end_of_text_id=self.tokenizer.end_of_text_id,
            encoder=self.encoder_name,
            verified_documents=tally.verified,
            files=files,
            seconds=round(seconds, 3),
            tokens_per_second=round(new_tokens / seconds, 1) if seconds > 0 else 0.0,
            fallback_reason=self.fallback,
            code_version=_code_version(),
            shard_tokens=self.data.shard_tokens,
            workers=self.workers,
            empty_documents_skipped=tally.empty,
            source=self.corpus.record(),
            budget=Budget(
                self.corpus.cfg.max_documents, self.corpus.cfg.max_bytes, self.data.max_tokens, journal.cut
            ),
            resumed_at_unit=resumed_at,
        )
        self._write_manifests(manifest)
        (self.building / JOURNAL).unlink(missing_ok=True)
        publish_directory(self.building, self.final)
        return manifest

    def _stats(self, tally: Tally) -> dict[str, SplitStats]:
        stats = {split: SplitStats(*tally.splits[split]) for split in SPLITS}
        where = self.corpus.source
        if tally.documents == 0:
            raise DataError(f"{where}: the corpus holds no documents (every one is empty)")
        cfg = self.corpus.cfg
        for name, split in stats.items():
            if split.documents == 0:
                raise DataError(
                    f"{where}: the {name} split is empty ({tally.documents} documents, "
                    f"corpus.validation_fraction {cfg.validation_fraction}, corpus.test_fraction "
                    f"{cfg.test_fraction}); add documents or change the fractions"
                )
        return stats

    def _write_manifests(self, manifest: TokenFolderManifest) -> None:
        for split, tokens in manifest.files.items():
            write_manifest(
                self.building / f"{split}.manifest.json",
                TokenFileManifest(
                    dtype=manifest.dtype,
                    token_count=tokens.tokens,
                    document_count=tokens.documents,
                    vocab_size=manifest.vocab_size,
                    tokenizer_sha256=manifest.tokenizer_sha256,
                    corpus_fingerprint=manifest.corpus_fingerprint,
                    split=split,
                    sha256=tokens.sha256,
                    end_of_text_id=manifest.end_of_text_id,
                    text_bytes=tokens.text_bytes,
                    shards=tokens.shards,
                ),
            )
        write_json_atomic(self.building / FOLDER_MANIFEST, manifest.to_dict())


@contextlib.contextmanager
def _out_of_space(final: Path, building: Path) -> Iterator[None]:
    """A full disk mid-build: one line; the journal and the shards it names are kept for the next run."""
    try:
        yield
    except OSError as error:
        if not is_disk_full(error):
            raise
        raise DiskFullError(
            f"{final}: no space left on the disk ({megabytes(free_bytes(building))} free); the shards "
            f"written so far are kept in {building.name}: free space and run again to carry on"
        ) from None


def expected_encoder(tokenizer: TokenizerManifest) -> str:
    """The encoder `auto` picks for this tokenizer."""
    from gptcore.data.encoders import why_not_tiktoken

    spec = json.loads(Path(tokenizer.path).read_text(encoding="utf-8"))
    return "tiktoken" if why_not_tiktoken(spec) is None else "tokenizers"


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
