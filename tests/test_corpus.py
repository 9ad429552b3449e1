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

from gptcore.config import CorpusConfig
from gptcore.data.corpus import SPLITS, corpus_fingerprint, decode_utf8, load_corpus, split_of, stdlib_files
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


def all_texts(corpus) -> list[str]:
    return [text for split in SPLITS for text in corpus.splits[split]["text"]]


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
    corpus = load_corpus(local([str(tmp_path / "docs")]))
    assert sorted(all_texts(corpus)) == sorted(texts)
    assert corpus.train.column_names == ["text"]
    stats = corpus.stats
    assert sum(split.documents for split in stats.values()) == 40
    assert sum(split.bytes for split in stats.values()) == sum(len(t.encode()) for t in texts)
    assert stats["validation"].documents > 0 and stats["train"].documents > stats["validation"].documents
    assert stats["test"].documents > 0
    assert json.loads(json.dumps(corpus.to_dict()))["fingerprint"] == corpus.fingerprint


def test_document_per_line_and_globs(tmp_path):
    (tmp_path / "a.txt").write_text("first line\nsecond line\n\nthird line\n", encoding="utf-8")
    (tmp_path / "b.md").write_text("not matched by the glob\n", encoding="utf-8")
    corpus = load_corpus(local([str(tmp_path / "*.txt")], document_per="line", validation_fraction=0.5))
    assert sorted(all_texts(corpus)) == ["first line", "second line", "third line"]
    assert corpus.empty_documents_skipped == 1


def test_split_is_decided_by_content_and_stays_when_documents_are_added(tmp_path):
    write_documents(tmp_path / "docs", 60)
    before = load_corpus(local([str(tmp_path / "docs")]))
    write_documents(tmp_path / "docs", 60, start=60)
    after = load_corpus(local([str(tmp_path / "docs")]))
    assert set(before.validation["text"]) <= set(after.validation["text"])
    assert set(before.train["text"]) <= set(after.train["text"])
    reseeded = load_corpus(local([str(tmp_path / "docs")], split_seed=7))
    assert set(reseeded.validation["text"]) != set(after.validation["text"])
    assert reseeded.fingerprint != after.fingerprint
    assert set(before.test["text"]) <= set(after.test["text"])
    assert split_of(b"same bytes", 1, 0.5, 0.2) == split_of(b"same bytes", 1, 0.5, 0.2)


def test_the_test_split_is_held_out_and_taken_from_train_alone(tmp_path):
    write_documents(tmp_path / "docs", 80)
    without = load_corpus(local([str(tmp_path / "docs")], test_fraction=0.01))
    held_out = load_corpus(local([str(tmp_path / "docs")], test_fraction=0.25))
    test = set(held_out.test["text"])
    assert len(test) >= 10 and not test & set(held_out.train["text"])
    assert not test & set(held_out.validation["text"])
    assert set(held_out.validation["text"]) == set(without.validation["text"])  # validation never moves
    assert test <= set(without.train["text"]) | set(without.test["text"])
    assert held_out.fingerprint != without.fingerprint


def test_fractions_that_leave_nothing_to_train_on_are_refused():
    with pytest.raises(ValueError, match=r"corpus.validation_fraction 0.5 \+ corpus.test_fraction 0.5"):
        CorpusConfig(validation_fraction=0.5, test_fraction=0.5)


def test_fingerprint_follows_content_not_modification_time(tmp_path):
    write_documents(tmp_path / "docs", 20)
    cfg = local([str(tmp_path / "docs")])
    first = load_corpus(cfg).fingerprint
    target = tmp_path / "docs" / "doc_0003.txt"
    os.utime(target, (1_000_000_000, 1_000_000_000))
    assert load_corpus(cfg).fingerprint == first
    assert corpus_fingerprint(cfg) == first
    target.write_text(target.read_text() + "one more word\n", encoding="utf-8")
    assert corpus_fingerprint(cfg) != first
    assert load_corpus(cfg).fingerprint == corpus_fingerprint(cfg)
    assert corpus_fingerprint(local([str(tmp_path / "docs")], validation_fraction=0.3)) != corpus_fingerprint(
        cfg
    )


def test_undecodable_bytes_are_replaced_and_counted(tmp_path):
    write_documents(tmp_path / "docs", 20)
    (tmp_path / "docs" / "latin1.txt").write_bytes("café déjà vu\n".encode("latin-1"))
    corpus = load_corpus(local([str(tmp_path / "docs")]))
    assert sum(stats.replaced_bytes for stats in corpus.stats.values()) == 3
    assert "caf\ufffd d\ufffdj\ufffd vu\n" in all_texts(corpus)
    assert decode_utf8(b"ok \xff\xfe") == ("ok \ufffd\ufffd", 2)


def test_jsonl_with_a_named_field_and_parquet_with_a_named_column(tmp_path):
    rows = [{"body": f"record {i} " + " ".join(WORDS[i % 5 :]), "id": i} for i in range(30)]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n", encoding="utf-8")
    pq.write_table(pa.table({"content": [row["body"] for row in rows]}), tmp_path / "data.parquet")
    cache = tmp_path / "cache"
    from_json = load_corpus(local([str(tmp_path / "data.jsonl")], text_field="body"), cache)
    from_parquet = load_corpus(local([str(tmp_path / "data.parquet")], text_field="content"), cache)
    expected = sorted(row["body"] for row in rows)
    assert sorted(all_texts(from_json)) == expected == sorted(all_texts(from_parquet))
    assert from_json.train.column_names == ["text"]
    assert (cache / "json").is_dir(), "datasets caches inside the given folder, not the home directory"
    assert (
        corpus_fingerprint(local([str(tmp_path / "data.jsonl")], text_field="body")) == from_json.fingerprint
    )


def test_hub_source_loads_a_local_dataset_folder_and_a_saved_dataset(tmp_path):
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    rows = [{"text": f"hub row {i} {WORDS[i % len(WORDS)]}"} for i in range(40)]
    (folder / "train.jsonl").write_text("\n".join(json.dumps(row) for row in rows), encoding="utf-8")
    cfg = CorpusConfig(source="hub", hub_name=str(folder), hub_split="train", validation_fraction=0.2)
    corpus = load_corpus(cfg, tmp_path / "cache")
    assert sorted(all_texts(corpus)) == sorted(row["text"] for row in rows)

    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(saved))
    from_disk = load_corpus(CorpusConfig(source="hub", hub_name=str(saved), validation_fraction=0.2))
    assert from_disk.fingerprint == corpus.fingerprint, "same documents, same settings, same fingerprint"


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
        (lambda p: local([str(p / "empty")]), DataError, r"no documents"),
        (
            lambda p: local([str(p / "rows.jsonl")], text_field="body"),
            DataError,
            r"no text field 'body'.*text",
        ),
        (lambda p: local([str(p / "rows.jsonl"), str(p / "empty")]), ConfigError, r"mixed formats"),
        (lambda p: local([str(p / "broken.jsonl")]), DataError, r"broken.jsonl.*cannot read as jsonl"),
    ],
    ids=["missing-path", "glob-no-match", "empty-corpus", "missing-field", "mixed-formats", "bad-json"],
)
def test_bad_sources_are_one_line_errors_naming_what_and_where(tmp_path, make, error, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "blank.txt").write_text("", encoding="utf-8")
    (tmp_path / "rows.jsonl").write_text('{"text": "a row"}\n', encoding="utf-8")
    (tmp_path / "broken.jsonl").write_text('{"text": "unclosed\n', encoding="utf-8")
    with pytest.raises(error, match=message) as raised:
        load_corpus(make(tmp_path))
    assert "\n" not in str(raised.value)


def test_a_split_left_empty_is_an_error(tmp_path):
    (tmp_path / "one.txt").write_text("a single document\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"split is empty \(1 documents"):
        load_corpus(local([str(tmp_path / "one.txt")]))
