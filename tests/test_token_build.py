"""Token files: exact ids in shards, the documents back on decoding, manifests, budgets, workers that
change nothing, a kill that loses nothing, and nothing half-written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, normalizers

from gptcore.data import build as token_build
from gptcore.data import shards as shard_files
from gptcore.data.build import Budget, build_token_files, read_token_folder_manifest, token_files_fingerprint
from gptcore.data.config import CorpusConfig, DataConfig, TokenizerConfig
from gptcore.data.corpus import SPLITS, Corpus, open_corpus
from gptcore.data.documents import split_documents
from gptcore.data.encoders import HFEncoder, TiktokenEncoder, make_encoder, why_not_tiktoken
from gptcore.data.tokenfile import check_vocabulary, open_tokens
from gptcore.data.tokenizer import TokenizerManifest, train_tokenizer
from gptcore.errors import ConfigError, DataError, DiskFullError
from gptcore.tools.fingerprint import sha256_file
from tests.disk_full_support import open_filling

STDLIB = Path(sysconfig.get_paths()["stdlib"])
PATHS = [str(STDLIB / "json" / "*.py"), str(STDLIB / "email" / "*.py"), str(STDLIB / "unittest" / "*.py")]
SMALL_SHARDS = DataConfig(shard_tokens=20_000, workers=1)  # a few shards per split, encoded in this process


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return open_corpus(CorpusConfig(source="local", paths=PATHS, validation_fraction=0.2, test_fraction=0.2))


@pytest.fixture(scope="module")
def many_units() -> Corpus:
    """The same corpus cut into units of 16 KiB: progress a resumed build can start from."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("gptcore.data.corpus.UNIT_BYTES", 16384)
        return open_corpus(
            CorpusConfig(source="local", paths=PATHS, validation_fraction=0.2, test_fraction=0.2)
        )


@pytest.fixture(scope="module")
def tokenizer(corpus, tmp_path_factory) -> TokenizerManifest:
    return train_tokenizer(corpus, TokenizerConfig(vocab_size=512), tmp_path_factory.mktemp("data"))


def documents_of(corpus: Corpus) -> dict[str, list[str]]:
    """Each split's documents in source order, read as the build reads them."""
    found: dict[str, list[str]] = {split: [] for split in SPLITS}
    for unit in corpus.units():
        for split, document in split_documents(unit, corpus.reading):
            if split is not None:
                found[split].append(document.text)
    return found


def documents_in(path: str, end_of_text_id: int) -> list[np.ndarray]:
    tokens = np.asarray(open_tokens(path).tokens)
    ends = np.flatnonzero(tokens == end_of_text_id)
    assert ends[-1] == len(tokens) - 1, "every document, the last included, ends with end-of-text"
    return np.split(tokens, ends + 1)[:-1]


def shard_hashes(manifest) -> dict[str, list[str]]:
    return {split: [shard.sha256 for shard in tokens.shards] for split, tokens in manifest.files.items()}


def test_builds_every_split_as_shards_with_manifests_the_trainer_can_read(corpus, tokenizer, tmp_path):
    manifest = build_token_files(corpus, tokenizer, tmp_path, data=SMALL_SHARDS)
    folder = tmp_path / "tokens" / token_files_fingerprint(corpus.fingerprint, tokenizer, SMALL_SHARDS)
    assert Path(manifest.directory) == folder.resolve()
    train_shards = [shard.file for shard in manifest.train.shards]
    assert train_shards[:2] == ["train-000000.bin", "train-000001.bin"] and len(train_shards) > 5
    names = sorted(child.name for child in folder.iterdir())
    assert names == sorted(
        ["manifest.json", *(f"{split}.manifest.json" for split in SPLITS)]
        + [shard.file for split in manifest.files.values() for shard in split.shards]
    )
    assert read_token_folder_manifest(folder) == manifest
    assert json.loads(json.dumps(manifest.to_dict()))["files"]["train"]["tokens"] == manifest.train.tokens
    expected = documents_of(corpus)
    for split, texts in expected.items():
        tokens = manifest.files[split]
        stream = open_tokens(tokens.path)
        assert stream.manifest is not None and stream.manifest.dtype == "uint16"
        assert stream.manifest.split == split and stream.manifest.corpus_fingerprint == corpus.fingerprint
        assert stream.manifest.tokenizer_sha256 == tokenizer.sha256 == sha256_file(tokenizer.path)
        assert stream.manifest.document_count == len(texts) == tokens.documents
        assert sum(shard.documents for shard in tokens.shards) == len(texts)
        assert len(stream) == stream.manifest.token_count == tokens.tokens
        assert all(shard.tokens == 20_000 for shard in tokens.shards[:-1]), "the last holds the rest"
        for shard in tokens.shards:
            assert sha256_file(folder / shard.file) == shard.sha256
        assert stream.manifest.text_bytes == sum(len(t.encode()) for t in texts) == tokens.text_bytes
        check_vocabulary(stream, tokenizer.vocab_size)
    assert manifest.tokens_per_second > 0 and manifest.resumed_at_unit == 0
    assert not [p.name for p in (tmp_path / "tokens").glob(".*") if not p.name.endswith(".lock")]


def test_decoding_the_shards_gives_back_the_documents_across_shard_boundaries(corpus, tokenizer, tmp_path):
    manifest = build_token_files(corpus, tokenizer, tmp_path, data=SMALL_SHARDS)
    hf = Tokenizer.from_file(tokenizer.path)
    for split, texts in documents_of(corpus).items():
        pieces = documents_in(manifest.files[split].path, tokenizer.end_of_text_id)
        assert len(pieces) == len(texts)
        for index in range(0, len(texts), 3):
            assert hf.decode(pieces[index][:-1].tolist()) == texts[index]
    stream = open_tokens(manifest.train.path).tokens
    whole = np.concatenate(
        [np.fromfile(Path(manifest.directory) / s.file, "<u2") for s in manifest.train.shards]
    )
    across = np.array([[19_998, 19_999, 20_000, 20_001], [0, 39_999, 40_000, len(whole) - 1]])
    np.testing.assert_array_equal(stream[across], whole[across])
    np.testing.assert_array_equal(stream[19_990:20_010], whole[19_990:20_010])


def test_one_worker_and_two_give_the_same_shards_byte_for_byte(corpus, tokenizer, tmp_path):
    one = build_token_files(corpus, tokenizer, tmp_path / "one", data=SMALL_SHARDS)
    two = build_token_files(
        corpus, tokenizer, tmp_path / "two", data=DataConfig(shard_tokens=20_000, workers=2)
    )
    assert two.workers == 2 and shard_hashes(two) == shard_hashes(one)
    assert one.fingerprint == two.fingerprint, "the number of workers is not part of the output's identity"


def test_budgets_keep_whole_documents_in_source_order_and_say_so(tokenizer, tmp_path):
    def build(data: DataConfig = SMALL_SHARDS, **corpus_settings):
        cfg = CorpusConfig(
            source="local", paths=PATHS, validation_fraction=0.2, test_fraction=0.2, **corpus_settings
        )
        return build_token_files(open_corpus(cfg), tokenizer, tmp_path, data=data)

    whole = build()
    assert whole.budget is not None and whole.budget.cut_the_source is False
    by_documents = build(max_documents=20)
    assert sum(split.documents for split in by_documents.files.values()) == 20
    assert by_documents.budget == Budget(max_documents=20, cut_the_source=True)
    by_bytes = build(max_bytes=500_000)
    kept = sum(split.text_bytes for split in by_bytes.files.values())
    assert 500_000 <= kept < 500_000 + 120_000, "documents until the budget is reached, the last whole"
    by_tokens = build(DataConfig(shard_tokens=20_000, workers=1, max_tokens=250_000))
    assert 250_000 <= by_tokens.train.tokens < whole.train.tokens
    assert by_tokens.fingerprint != whole.fingerprint


def test_the_fast_encoder_gives_the_ids_of_encode_batch_fast(corpus, tokenizer, tmp_path):
    texts = [text for split in documents_of(corpus).values() for text in split]
    texts += ["it's 'll 've  \t\n\n  x", "Ünïcödé ✓ 日本語 123 4567 αβγ\r\n", "literal <|endoftext|> inside"]
    fast = make_encoder(tokenizer.path)
    assert isinstance(fast, TiktokenEncoder)
    reference = HFEncoder(Tokenizer.from_file(tokenizer.path))
    for mine, theirs in zip(fast.encode_batch(texts), reference.encode_batch(texts), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    by_tiktoken = build_token_files(corpus, tokenizer, tmp_path / "a", data=SMALL_SHARDS, verify_fraction=1.0)
    by_tokenizers = build_token_files(
        corpus, tokenizer, tmp_path / "b", data=SMALL_SHARDS, encoder="tokenizers"
    )
    assert by_tiktoken.encoder == "tiktoken" and by_tokenizers.encoder == "tokenizers"
    assert by_tiktoken.verified_documents > len(texts) // 2
    assert shard_hashes(by_tiktoken) == shard_hashes(by_tokenizers)


def test_a_tokenizer_tiktoken_cannot_reproduce_uses_encode_batch_fast(tokenizer, tmp_path):
    hf = Tokenizer.from_file(tokenizer.path)
    hf.normalizer = normalizers.Lowercase()
    changed = tmp_path / "tokenizer.json"
    hf.save(str(changed))
    assert why_not_tiktoken(json.loads(changed.read_text())) == "it has a normalizer"
    assert isinstance(make_encoder(changed), HFEncoder)


def test_a_difference_found_while_checking_rebuilds_with_encode_batch_fast(
    corpus, tokenizer, tmp_path, monkeypatch
):
    reference = build_token_files(
        corpus, tokenizer, tmp_path / "reference", data=SMALL_SHARDS, encoder="tokenizers"
    )
    original = TiktokenEncoder.encode

    def off_by_one(self, text):
        ids = original(self, text)
        return ids + 1 if "charset" in text else ids

    monkeypatch.setattr(TiktokenEncoder, "encode", off_by_one)
    rebuilt = build_token_files(
        corpus, tokenizer, tmp_path / "checked", data=SMALL_SHARDS, verify_fraction=1.0
    )
    assert rebuilt.encoder == "tokenizers" and "encodes differently" in (rebuilt.fallback_reason or "")
    assert shard_hashes(rebuilt) == shard_hashes(reference)


def test_an_interrupted_build_leaves_nothing_that_looks_finished(corpus, tokenizer, tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(token_build._Build, "_write_manifests", fail)
    with pytest.raises(KeyboardInterrupt):
        build_token_files(corpus, tokenizer, tmp_path, data=SMALL_SHARDS)
    assert all(child.name.startswith(".") for child in (tmp_path / "tokens").iterdir())


KILLED_AT_UNIT = 25
KILLED_BUILD = """
import os, signal, sys
from pathlib import Path
import gptcore.data.corpus as corpus_module
from gptcore.data.config import CorpusConfig, DataConfig
from gptcore.data import build
from gptcore.data.tokenizer import read_tokenizer_manifest

corpus_module.UNIT_BYTES = 16384  # many units, a journal entry after each
build.JOURNAL_EVERY_SECONDS = 0.0
append = build._Build._append
def append_until_killed(self, result, tally, writers):
    # kill -9 halfway through unit {unit}: its training ids on disk past the journal's entry, the rest not
    if result.index == {unit}:
        def killed(*args):
            writers["train"].handle.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        writers["validation"].append = killed
    return append(self, result, tally, writers)
build._Build._append = append_until_killed
cfg = CorpusConfig(source="local", paths={paths!r}, validation_fraction=0.2, test_fraction=0.2)
tokenizer = read_tokenizer_manifest(Path({tokenizer!r}))
data = DataConfig(shard_tokens=20_000, workers=1)
build.build_token_files(corpus_module.open_corpus(cfg), tokenizer, Path(sys.argv[1]), data=data)
"""


def test_a_build_killed_at_any_moment_carries_on_to_the_same_shards(many_units, tokenizer, tmp_path):
    script = KILLED_BUILD.format(unit=KILLED_AT_UNIT, paths=PATHS, tokenizer=str(Path(tokenizer.path).parent))
    killed = subprocess.run([sys.executable, "-c", script, str(tmp_path / "killed")], timeout=300)
    assert killed.returncode == -signal.SIGKILL, "killed where placed, not finished nor failed"
    tokens = tmp_path / "killed" / "tokens"
    assert [child.name for child in tokens.iterdir() if not child.name.startswith(".")] == []
    (building,) = tokens.glob(".*.building")
    journal = json.loads((building / "progress.json").read_text())
    assert journal["next_unit"] == KILLED_AT_UNIT, "the last entry: after the unit before the kill's"
    train = journal["splits"]["train"]
    listed = {shard["file"] for shard in train["shards"]}
    past = sum(path.stat().st_size for path in building.glob("train-*") if path.name not in listed)
    synced = 2 * train["open"]["tokens"]  # bytes of uint16 ids the journal's entry counts
    assert past > synced, "ids on disk past the journal's entry, for the next run to drop"
    assert list(building.glob("*.partial")), "an open shard, never taken as complete"

    resumed = build_token_files(many_units, tokenizer, tmp_path / "killed", data=SMALL_SHARDS)
    uninterrupted = build_token_files(many_units, tokenizer, tmp_path / "whole", data=SMALL_SHARDS)
    assert resumed.resumed_at_unit == KILLED_AT_UNIT and uninterrupted.resumed_at_unit == 0
    assert shard_hashes(resumed) == shard_hashes(uninterrupted)
    assert {s: t.documents for s, t in resumed.files.items()} == {
        s: t.documents for s, t in uninterrupted.files.items()
    }


def test_a_build_killed_mid_write_by_the_old_layout_is_cleaned_up_by_the_next(corpus, tokenizer, tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    key = token_files_fingerprint(corpus.fingerprint, tokenizer, SMALL_SHARDS)
    leftover = tmp_path / "tokens" / f".{key}.partial-{dead.stdout.strip()}-abc"
    leftover.mkdir(parents=True)
    (leftover / "train.bin").write_bytes(b"\x00" * 10)
    manifest = build_token_files(corpus, tokenizer, tmp_path, data=SMALL_SHARDS)
    assert [child.name for child in (tmp_path / "tokens").iterdir() if not child.name.endswith(".lock")] == [
        key
    ]
    rebuilt = build_token_files(corpus, tokenizer, tmp_path, data=SMALL_SHARDS)
    assert shard_hashes(rebuilt) == shard_hashes(manifest) and os.path.isfile(rebuilt.train.path)


def test_bad_encoder_names_and_out_of_vocabulary_ids_are_refused(corpus, tokenizer, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"encoder 'fastest' is not allowed"):
        build_token_files(corpus, tokenizer, tmp_path, encoder="fastest")
    monkeypatch.setattr(TiktokenEncoder, "encode", lambda self, text: np.full(3, 9999, dtype=np.uint32))
    with pytest.raises(
        DataError, match=r"tokenizer.json: encoder produced id 9999 outside the vocabulary 512"
    ):
        build_token_files(corpus, tokenizer, tmp_path, data=SMALL_SHARDS, verify_fraction=0.0)
    assert all(child.name.startswith(".") for child in (tmp_path / "tokens").iterdir())


def test_a_full_disk_keeps_what_was_written_and_the_next_run_carries_on(
    many_units, tokenizer, tmp_path, monkeypatch
):
    uninterrupted = build_token_files(many_units, tokenizer, tmp_path / "whole", data=SMALL_SHARDS)
    monkeypatch.setattr(token_build, "JOURNAL_EVERY_SECONDS", 0.0)
    monkeypatch.setattr(
        shard_files, "open", open_filling("train-000003.bin.partial", room=4096), raising=False
    )
    with pytest.raises(DiskFullError) as full:
        build_token_files(many_units, tokenizer, tmp_path / "full", data=SMALL_SHARDS)
    folder = tmp_path / "full" / "tokens" / uninterrupted.fingerprint
    assert str(full.value).startswith(f"{folder}: no space left on the disk (")
    assert str(full.value).endswith("free space and run again to carry on") and "\n" not in str(full.value)
    assert not folder.exists() and (folder.parent / f".{folder.name}.building" / "train-000002.bin").is_file()
    monkeypatch.undo()  # space freed: the same build carries on
    resumed = build_token_files(many_units, tokenizer, tmp_path / "full", data=SMALL_SHARDS)
    assert resumed.resumed_at_unit > 0 and shard_hashes(resumed) == shard_hashes(uninterrupted)


def test_a_disk_too_small_for_the_estimate_is_refused_after_the_first_unit(
    many_units, tokenizer, tmp_path, monkeypatch
):
    monkeypatch.setattr(token_build, "free_bytes", lambda path: 10_000)
    with pytest.raises(
        DiskFullError, match=r"the token files need about [\d.]+ MB more, 0.0 MB are free there"
    ):
        build_token_files(many_units, tokenizer, tmp_path, data=SMALL_SHARDS)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda folder: (folder / "train-000001.bin").unlink(),
            r"train-000001.bin: shard named by train.manifest.json is missing",
        ),
        (
            lambda folder: (folder / "train-000001.bin").write_bytes(b"\0\0"),
            r"train-000001.bin: 2 bytes, but train.manifest.json says 20000 uint16 tokens",
        ),
        (
            lambda folder: (folder / "train-000001.bin").write_bytes(b"\1" * 40_000),
            r"train-000001.bin: content differs from the sha256 train.manifest.json records",
        ),
        (
            lambda folder: (folder / "train.manifest.json").write_text(
                json.dumps({**json.loads((folder / "train.manifest.json").read_text()), "shards": []})
            ),
            r"train.manifest.json: the train split lists no shards",
        ),
    ],
    ids=["missing-shard", "wrong-size", "wrong-sha256", "no-shards"],
)
def test_a_damaged_shard_set_is_refused_in_one_line(corpus, tokenizer, tmp_path, damage, message):
    manifest = build_token_files(corpus, tokenizer, tmp_path, data=SMALL_SHARDS)
    damage(Path(manifest.directory))
    with pytest.raises(DataError, match=message) as refused:
        open_tokens(manifest.train.path)
    assert "\n" not in str(refused.value)


def test_under_json_the_build_reports_its_progress_as_json_lines(
    corpus, tokenizer, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("GPTPIPE_JSON", "1")
    manifest = build_token_files(corpus, tokenizer, tmp_path, data=SMALL_SHARDS)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines and lines[-1]["event"] == "data_progress" and lines[-1]["stage"] == "tokens"
    last = lines[-1]
    assert last["tokens"] == sum(split.tokens for split in manifest.files.values())
    assert last["documents"] == sum(split.documents for split in manifest.files.values())
    assert last["source_bytes"] == corpus.source_bytes and last["tokens_per_second"] > 0
