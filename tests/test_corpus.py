"""Corpus sources: what becomes a document, how it splits, and what the fingerprint notices."""

from __future__ import annotations

import json
import os
import sysconfig
from pathlib import Path

import datasets
import huggingface_hub.constants
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gptcore.data.build import build_token_files
from gptcore.data.config import CorpusConfig, TokenizerConfig
from gptcore.data.corpus import (
    SPLITS,
    Corpus,
    corpus_fingerprint,
    decode_utf8,
    open_corpus,
    split_of,
    stdlib_files,
)
from gptcore.data.documents import Segment, read_documents, split_documents
from gptcore.data.tokenizer import train_tokenizer
from gptcore.errors import ConfigError, DataError

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
]


def write_documents(folder: Path, count: int, start: int = 0) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    texts = []
    for number in range(start, start + count):
        text = (
            f"document {number}: " + " ".join(WORDS[(number * 7 + k) % len(WORDS)] for k in range(30)) + "\n"
        )
        (folder / f"doc_{number:04d}.txt").write_text(text, encoding="utf-8")
        texts.append(text)
    return texts


def local(paths: list[str], **settings: object) -> CorpusConfig:
    return CorpusConfig(
        source="local", paths=paths, **{"validation_fraction": 0.2, "test_fraction": 0.2, **settings}
    )


class Split(dict):
    """The corpus read as the build reads it: each split's texts in source order, and the empties."""

    def __init__(self, corpus: Corpus) -> None:
        super().__init__({split: [] for split in SPLITS})
        self.empty = self.replaced = 0
        for unit in corpus.units():
            for split, document in split_documents(unit, corpus.reading):
                if split is None:
                    self.empty += 1
                else:
                    self[split].append(document.text)
                    self.replaced += document.replaced

    @property
    def texts(self) -> list[str]:
        return [text for split in SPLITS for text in self[split]]


def load_corpus(cfg: CorpusConfig, cache: Path | None = None) -> tuple[Corpus, Split]:
    corpus = open_corpus(cfg, cache)
    return corpus, Split(corpus)


def all_texts(loaded: tuple[Corpus, Split]) -> list[str]:
    return loaded[1].texts


def test_builtin_corpus_is_the_stdlib_sources_in_a_stable_order():
    files = stdlib_files()
    root = Path(sysconfig.get_paths()["stdlib"])
    assert len(files) > 500
    assert all(path.suffix == ".py" and "site-packages" not in path.parts for path in files)
    relative = [path.relative_to(root).as_posix() for path in files]
    assert relative == sorted(relative)
    assert root / "json" / "decoder.py" in files


def test_folder_of_text_files_gives_one_document_per_file(tmp_path):
    texts = write_documents(tmp_path / "docs", 40)
    corpus, split = load_corpus(local([str(tmp_path / "docs")]))
    assert sorted(split.texts) == sorted(texts)
    assert len(split["validation"]) > 0 and len(split["train"]) > len(split["validation"])
    assert len(split["test"]) > 0
    assert corpus.source_bytes == sum(len(t.encode()) for t in texts)
    assert json.loads(json.dumps(corpus.to_dict()))["fingerprint"] == corpus.fingerprint


def test_document_per_line_and_globs(tmp_path):
    (tmp_path / "a.txt").write_text("first line\nsecond line\n\nthird line\n", encoding="utf-8")
    (tmp_path / "b.md").write_text("not matched by the glob\n", encoding="utf-8")
    _corpus, split = load_corpus(
        local([str(tmp_path / "*.txt")], document_per="line", validation_fraction=0.5)
    )
    assert sorted(split.texts) == ["first line", "second line", "third line"]
    assert split.empty == 1


def test_split_is_decided_by_content_and_stays_when_documents_are_added(tmp_path):
    write_documents(tmp_path / "docs", 60)
    _, before = load_corpus(local([str(tmp_path / "docs")]))
    write_documents(tmp_path / "docs", 60, start=60)
    after_corpus, after = load_corpus(local([str(tmp_path / "docs")]))
    assert set(before["validation"]) <= set(after["validation"])
    assert set(before["train"]) <= set(after["train"])
    reseeded_corpus, reseeded = load_corpus(local([str(tmp_path / "docs")], split_seed=7))
    assert set(reseeded["validation"]) != set(after["validation"])
    assert reseeded_corpus.fingerprint != after_corpus.fingerprint
    assert set(before["test"]) <= set(after["test"])
    assert split_of(b"same bytes", 1, 0.5, 0.2) == split_of(b"same bytes", 1, 0.5, 0.2)


def test_the_test_split_is_held_out_and_taken_from_train_alone(tmp_path):
    write_documents(tmp_path / "docs", 80)
    without_corpus, without = load_corpus(local([str(tmp_path / "docs")], test_fraction=0.01))
    held_out_corpus, held_out = load_corpus(local([str(tmp_path / "docs")], test_fraction=0.25))
    test = set(held_out["test"])
    assert len(test) >= 10 and not test & set(held_out["train"])
    assert not test & set(held_out["validation"])
    assert set(held_out["validation"]) == set(without["validation"])  # validation never moves
    assert test <= set(without["train"]) | set(without["test"])
    assert held_out_corpus.fingerprint != without_corpus.fingerprint


def test_fractions_that_leave_nothing_to_train_on_are_refused():
    with pytest.raises(ValueError, match=r"corpus.validation_fraction 0.5 \+ corpus.test_fraction 0.5"):
        CorpusConfig(validation_fraction=0.5, test_fraction=0.5)


def test_fingerprint_follows_content_not_modification_time(tmp_path):
    write_documents(tmp_path / "docs", 20)
    cfg = local([str(tmp_path / "docs")])
    first = open_corpus(cfg).fingerprint
    target = tmp_path / "docs" / "doc_0003.txt"
    os.utime(target, (1_000_000_000, 1_000_000_000))
    assert open_corpus(cfg).fingerprint == first
    assert corpus_fingerprint(cfg) == first
    target.write_text(target.read_text() + "one more word\n", encoding="utf-8")
    assert corpus_fingerprint(cfg) != first
    assert open_corpus(cfg).fingerprint == corpus_fingerprint(cfg)
    assert corpus_fingerprint(local([str(tmp_path / "docs")], validation_fraction=0.3)) != corpus_fingerprint(
        cfg
    )


def test_undecodable_bytes_are_replaced_and_counted(tmp_path):
    write_documents(tmp_path / "docs", 20)
    (tmp_path / "docs" / "latin1.txt").write_bytes("café déjà vu\n".encode("latin-1"))
    _, split = load_corpus(local([str(tmp_path / "docs")]))
    assert split.replaced == 3
    assert "caf\ufffd d\ufffdj\ufffd vu\n" in split.texts
    assert decode_utf8(b"ok \xff\xfe") == ("ok \ufffd\ufffd", 2)


def test_jsonl_with_a_named_field_and_parquet_with_a_named_column(tmp_path):
    rows = [{"body": f"record {i} " + " ".join(WORDS[i % 5 :]), "id": i} for i in range(30)]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n", encoding="utf-8")
    pq.write_table(pa.table({"content": [row["body"] for row in rows]}), tmp_path / "data.parquet")
    from_json = load_corpus(local([str(tmp_path / "data.jsonl")], text_field="body"))
    from_parquet = load_corpus(local([str(tmp_path / "data.parquet")], text_field="content"))
    expected = sorted(row["body"] for row in rows)
    assert sorted(all_texts(from_json)) == expected == sorted(all_texts(from_parquet))
    assert (
        corpus_fingerprint(local([str(tmp_path / "data.jsonl")], text_field="body"))
        == from_json[0].fingerprint
    )


def test_hub_source_loads_a_local_dataset_folder_and_a_saved_dataset(tmp_path):
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    rows = [{"text": f"hub row {i} {WORDS[i % len(WORDS)]}"} for i in range(40)]
    (folder / "train.jsonl").write_text("\n".join(json.dumps(row) for row in rows), encoding="utf-8")
    cfg = CorpusConfig(source="hub", hub_name=str(folder), hub_split="train", validation_fraction=0.2)
    corpus = load_corpus(cfg, tmp_path / "cache")
    assert sorted(all_texts(corpus)) == sorted(row["text"] for row in rows)
    assert (tmp_path / "cache" / "my_dataset").is_dir(), "datasets caches in the given folder, not the home"

    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(saved))
    from_disk = load_corpus(CorpusConfig(source="hub", hub_name=str(saved), validation_fraction=0.2))
    assert from_disk[0].fingerprint == corpus[0].fingerprint, (
        "same documents, same settings, same fingerprint"
    )

    streamed = load_corpus(cfg.model_copy(update={"streaming": True}), tmp_path / "cache")
    assert all_texts(streamed) == all_texts(corpus), "streamed: the same documents in the same order"
    assert streamed[0].planned is None and streamed[0].fingerprint != corpus[0].fingerprint


def test_hub_unreachable_offline_says_so_and_how_to_use_local_files(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    cfg = CorpusConfig(source="hub", hub_name="someone/not-cached-here")
    with pytest.raises(DataError, match=r"corpus.hub_name 'someone/not-cached-here': .*unreachable.*local"):
        load_corpus(cfg, tmp_path / "cache")


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda p: local([str(p / "missing")]), DataError, r"corpus.paths\[0\] '.*missing': no such file"),
        (lambda p: local([str(p / "*.nothing")]), DataError, r"no files match"),
        (lambda p: local([str(p / "empty")]), DataError, r"holds no train documents"),
        (
            lambda p: local([str(p / "rows.jsonl")], text_field="body"),
            DataError,
            r"no text field 'body'.*text",
        ),
        (lambda p: local([str(p / "rows.jsonl"), str(p / "empty")]), ConfigError, r"mixed formats"),
        (
            lambda p: local([str(p / "broken.jsonl")]),
            DataError,
            r"broken.jsonl: line at byte 0: cannot read as jsonl",
        ),
        (
            lambda p: local([str(p / "columns.parquet")], text_field="body"),
            DataError,
            r"columns.parquet: no text field 'body' \(corpus.text_field\); the columns are text, id",
        ),
        (lambda p: local([str(p / "one.txt")]), DataError, r"the validation split is empty \(1 documents"),
        (
            lambda p: local([str(p / "deep.jsonl")]),
            DataError,
            r"deep.jsonl: line at byte 0: cannot read as jsonl \(nested deeper than \d+ levels\)",
        ),
    ],
    ids=[
        "missing-path",
        "glob-no-match",
        "empty-corpus",
        "missing-field",
        "mixed-formats",
        "bad-json",
        "parquet-without-the-column",
        "a-split-left-empty",
        "nested-too-deep",
    ],
)
def test_bad_sources_are_one_line_errors_naming_what_and_where(tmp_path, make, error, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "blank.txt").write_text("", encoding="utf-8")
    (tmp_path / "rows.jsonl").write_text('{"text": "a row"}\n', encoding="utf-8")
    (tmp_path / "broken.jsonl").write_text('{"text": "unclosed\n', encoding="utf-8")
    (tmp_path / "one.txt").write_text("a single document\n", encoding="utf-8")
    (tmp_path / "deep.jsonl").write_text('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    pq.write_table(pa.table({"text": ["a"], "id": [1]}), tmp_path / "columns.parquet")
    with pytest.raises(error, match=message) as raised:
        corpus = open_corpus(make(tmp_path))  # the whole data side: files are read by the stages
        tokenizer = train_tokenizer(corpus, TokenizerConfig(vocab_size=300), tmp_path / "data")
        build_token_files(corpus, tokenizer, tmp_path / "data")
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "data" / "tokens").exists() or not any(
        path.name == "manifest.json" for path in (tmp_path / "data" / "tokens").rglob("*")
    ), "nothing published"


@pytest.mark.parametrize("file_format", ["line", "jsonl"])
def test_a_line_longer_than_the_limit_is_refused_unread(tmp_path, monkeypatch, file_format):
    monkeypatch.setattr("gptcore.data.documents.MAX_LINE_BYTES", 1 << 20)
    huge = "word " * (300 << 10)  # 1.5 MiB on one line
    if file_format == "jsonl":
        (tmp_path / "rows.jsonl").write_text(
            json.dumps({"text": "short"}) + "\n" + json.dumps({"text": huge})
        )
        cfg = local([str(tmp_path / "rows.jsonl")])
    else:
        (tmp_path / "rows.txt").write_text("short\n" + huge + "\n")
        cfg = local([str(tmp_path / "rows.txt")], document_per="line")
    corpus = open_corpus(cfg)
    with pytest.raises(DataError, match=r"rows\.\w+: line at byte \d+: longer than 1 MiB, the most one line"):
        [doc for unit in corpus.units() for doc in read_documents(unit, corpus.reading)]


@pytest.mark.parametrize("file_format", ["line", "jsonl"])
def test_files_cut_into_units_anywhere_give_every_line_once_in_order(tmp_path, monkeypatch, file_format):
    monkeypatch.setattr("gptcore.data.corpus.UNIT_BYTES", 50)  # cuts fall inside lines
    lines = [f"line {number} " + "word " * (number % 13) for number in range(300)]
    if file_format == "jsonl":
        (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
        cfg = local([str(tmp_path / "rows.jsonl")])
    else:
        (tmp_path / "rows.txt").write_text("".join(t + "\n" for t in lines))
        cfg = local([str(tmp_path / "rows.txt")], document_per="line")
    corpus = open_corpus(cfg)
    assert len(corpus.planned) > 100
    read = [doc.text for unit in corpus.units() for doc in read_documents(unit, corpus.reading)]
    assert read == lines


def test_parquet_row_groups_become_units_and_keep_their_order(tmp_path, monkeypatch):
    monkeypatch.setattr("gptcore.data.corpus.UNIT_BYTES", 1)
    texts = [f"row {number}" for number in range(100)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "rows.parquet", row_group_size=10)
    corpus = open_corpus(local([str(tmp_path / "rows.parquet")]))
    assert [unit.segments for unit in corpus.planned][:2] == [
        (Segment(str(tmp_path / "rows.parquet"), 0, 1),),
        (Segment(str(tmp_path / "rows.parquet"), 1, 2),),
    ]
    assert [doc.text for unit in corpus.units() for doc in read_documents(unit, corpus.reading)] == texts
