"""Token files: exact ids, the documents back on decoding, manifests, and nothing half-written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, normalizers

from gptcore.config import CorpusConfig, TokenizerConfig
from gptcore.data import build as token_build
from gptcore.data.build import build_token_files, read_token_folder_manifest, token_files_fingerprint
from gptcore.data.corpus import Corpus, load_corpus
from gptcore.data.encoders import HFEncoder, TiktokenEncoder, make_encoder, why_not_tiktoken
from gptcore.data.tokenfile import check_vocabulary, open_tokens
from gptcore.data.tokenizer import TokenizerManifest, train_tokenizer
from gptcore.errors import ConfigError, DataError, DiskFullError
from gptcore.tools.atomic import write_atomic
from gptcore.tools.fingerprint import sha256_file
from tests.disk_full_support import half_then_full, leftovers, open_filling, snapshot

STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    paths = [str(STDLIB / "json" / "*.py"), str(STDLIB / "email" / "*.py"), str(STDLIB / "unittest" / "*.py")]
    return load_corpus(CorpusConfig(source="local", paths=paths, validation_fraction=0.2, test_fraction=0.2))


@pytest.fixture(scope="module")
def tokenizer(corpus, tmp_path_factory) -> TokenizerManifest:
    return train_tokenizer(corpus, TokenizerConfig(vocab_size=512), tmp_path_factory.mktemp("data"))


def documents_in(path: str, end_of_text_id: int) -> list[np.ndarray]:
    tokens = np.asarray(open_tokens(path).tokens)
    ends = np.flatnonzero(tokens == end_of_text_id)
    assert ends[-1] == len(tokens) - 1, "every document, the last included, ends with end-of-text"
    return np.split(tokens, ends + 1)[:-1]


def test_builds_every_split_with_manifests_the_trainer_can_read(corpus, tokenizer, tmp_path):
    manifest = build_token_files(corpus, tokenizer, tmp_path)
    folder = tmp_path / "tokens" / token_files_fingerprint(corpus.fingerprint, tokenizer)
    assert Path(manifest.directory) == folder.resolve()
    assert sorted(child.name for child in folder.iterdir()) == [
        "manifest.json",
        "test.bin",
        "test.bin.manifest.json",
        "train.bin",
        "train.bin.manifest.json",
        "validation.bin",
        "validation.bin.manifest.json",
    ]
    assert read_token_folder_manifest(folder) == manifest
    assert json.loads(json.dumps(manifest.to_dict()))["files"]["train"]["tokens"] == manifest.train.tokens
    for split, dataset in corpus.splits.items():
        stream = open_tokens(manifest.files[split].path)
        assert stream.manifest is not None
        assert stream.manifest.dtype == "uint16" and stream.tokens.dtype == np.dtype("<u2")
        assert stream.manifest.split == split and stream.manifest.corpus_fingerprint == corpus.fingerprint
        assert stream.manifest.tokenizer_sha256 == tokenizer.sha256 == sha256_file(tokenizer.path)
        assert stream.manifest.document_count == len(dataset) == manifest.files[split].documents
        assert stream.manifest.end_of_text_id == tokenizer.end_of_text_id
        assert len(stream) == stream.manifest.token_count == manifest.files[split].tokens
        assert sha256_file(stream.path) == stream.manifest.sha256 == manifest.files[split].sha256
        assert stream.manifest.text_bytes == corpus.stats[split].bytes == manifest.files[split].text_bytes
        check_vocabulary(stream, tokenizer.vocab_size)
    assert manifest.tokens_per_second > 0 and not list((tmp_path / "tokens").glob(".*"))


def test_decoding_the_token_files_gives_back_the_documents(corpus, tokenizer, tmp_path):
    manifest = build_token_files(corpus, tokenizer, tmp_path)
    hf = Tokenizer.from_file(tokenizer.path)
    for split, dataset in corpus.splits.items():
        pieces = documents_in(manifest.files[split].path, tokenizer.end_of_text_id)
        assert len(pieces) == len(dataset)
        for index in range(0, len(dataset), 3):
            assert hf.decode(pieces[index][:-1].tolist()) == dataset[index]["text"]


def test_the_fast_encoder_gives_the_ids_of_encode_batch_fast(corpus, tokenizer, tmp_path):
    texts = [*corpus.train["text"], *corpus.validation["text"]]
    texts += ["it's 'll 've  \t\n\n  x", "Ünïcödé ✓ 日本語 123 4567 αβγ\r\n", "literal <|endoftext|> inside"]
    fast = make_encoder(tokenizer.path)
    assert isinstance(fast, TiktokenEncoder)
    reference = HFEncoder(Tokenizer.from_file(tokenizer.path))
    for mine, theirs in zip(fast.encode_batch(texts), reference.encode_batch(texts), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    by_tiktoken = build_token_files(corpus, tokenizer, tmp_path / "a", verify_fraction=1.0)
    by_tokenizers = build_token_files(corpus, tokenizer, tmp_path / "b", encoder="tokenizers")
    assert by_tiktoken.encoder == "tiktoken" and by_tokenizers.encoder == "tokenizers"
    assert by_tiktoken.verified_documents > len(corpus.train) // 2
    assert by_tiktoken.train.sha256 == by_tokenizers.train.sha256
    assert by_tiktoken.validation.sha256 == by_tokenizers.validation.sha256


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
    reference = build_token_files(corpus, tokenizer, tmp_path / "reference", encoder="tokenizers")
    original = TiktokenEncoder.encode

    def off_by_one(self, text):
        ids = original(self, text)
        return ids + 1 if "charset" in text else ids

    monkeypatch.setattr(TiktokenEncoder, "encode", off_by_one)
    rebuilt = build_token_files(corpus, tokenizer, tmp_path / "checked", verify_fraction=1.0)
    assert rebuilt.encoder == "tokenizers" and "encodes differently" in (rebuilt.fallback_reason or "")
    assert rebuilt.train.sha256 == reference.train.sha256


def test_an_interrupted_build_leaves_nothing_that_looks_finished(corpus, tokenizer, tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(token_build, "_write_file_manifests", fail)
    with pytest.raises(KeyboardInterrupt):
        build_token_files(corpus, tokenizer, tmp_path)
    assert list((tmp_path / "tokens").iterdir()) == []


def test_a_build_killed_mid_write_is_cleaned_up_by_the_next(corpus, tokenizer, tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    key = token_files_fingerprint(corpus.fingerprint, tokenizer)
    leftover = tmp_path / "tokens" / f".{key}.partial-{dead.stdout.strip()}-abc"
    leftover.mkdir(parents=True)
    (leftover / "train.bin").write_bytes(b"\x00" * 10)
    manifest = build_token_files(corpus, tokenizer, tmp_path)
    assert [child.name for child in (tmp_path / "tokens").iterdir()] == [key]
    assert open_tokens(manifest.train.path).manifest is not None
    rebuilt = build_token_files(corpus, tokenizer, tmp_path)
    assert rebuilt.train.sha256 == manifest.train.sha256 and os.path.isfile(rebuilt.train.path)


def test_bad_encoder_names_and_out_of_vocabulary_ids_are_refused(corpus, tokenizer, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"encoder 'fastest' is not allowed"):
        build_token_files(corpus, tokenizer, tmp_path, encoder="fastest")
    monkeypatch.setattr(TiktokenEncoder, "encode", lambda self, text: np.full(3, 9999, dtype=np.uint32))
    with pytest.raises(DataError, match=r"train.bin: encoder produced id 9999 outside the vocabulary 512"):
        build_token_files(corpus, tokenizer, tmp_path, verify_fraction=0.0)
    assert list((tmp_path / "tokens").iterdir()) == []


@pytest.mark.parametrize(
    "point", ["train.bin", "validation.bin", "manifest"], ids=["first-split", "later-split", "manifest"]
)
def test_a_full_disk_names_the_folder_and_the_bytes_and_keeps_the_earlier_build(
    corpus, tokenizer, tmp_path, monkeypatch, point
):
    earlier = build_token_files(corpus, tokenizer, tmp_path)
    folder = Path(earlier.train.path).parent
    before = snapshot(folder)
    if point == "manifest":
        from gptcore.data import tokenfile

        monkeypatch.setattr(
            tokenfile, "write_text_atomic", lambda target, text: write_atomic(target, half_then_full)
        )
    else:
        monkeypatch.setattr(token_build, "open", open_filling(point, room=4096), raising=False)
    with pytest.raises(DiskFullError) as full:
        build_token_files(corpus, tokenizer, tmp_path)
    message = str(full.value)
    text_bytes = sum(stats.bytes for stats in corpus.stats.values())
    assert message.startswith(
        f"{folder}: no space left on the disk: it needs about {text_bytes * 2 / 1e6:,.1f} MB"
    )
    assert message.endswith(f"the earlier {folder.name} is unchanged; free space and run again")
    assert leftovers(folder.parent) == [] and snapshot(folder) == before
    monkeypatch.undo()  # space freed: the same build runs through
    assert build_token_files(corpus, tokenizer, tmp_path).train.sha256 == earlier.train.sha256
