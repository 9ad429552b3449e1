"""Byte-level BPE training: what it writes, what decides its folder, and what it refuses."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from gptcore.data.config import CorpusConfig, TokenizerConfig
from gptcore.data.corpus import Corpus, open_corpus, split_of
from gptcore.data.tokenizer import read_tokenizer_manifest, tokenizer_fingerprint, train_tokenizer
from gptcore.errors import ConfigError, DataError
from gptcore.tools.fingerprint import sha256_file

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SMALL = TokenizerConfig(vocab_size=400, min_frequency=2)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    paths = [str(STDLIB / "json" / "*.py"), str(STDLIB / "email" / "*.py")]
    return open_corpus(CorpusConfig(source="local", paths=paths, validation_fraction=0.3, test_fraction=0.2))


def test_writes_a_loadable_byte_level_tokenizer_and_its_manifest(corpus, tmp_path):
    manifest = train_tokenizer(corpus, SMALL, tmp_path)
    folder = tmp_path / "tokenizers" / manifest.fingerprint
    assert Path(manifest.path) == folder.resolve() / "tokenizer.json"
    assert sorted(child.name for child in folder.iterdir()) == ["manifest.json", "tokenizer.json"]
    assert json.loads((folder / "manifest.json").read_text()) == manifest.to_dict()
    assert manifest.sha256 == sha256_file(manifest.path)
    assert manifest.fingerprint == tokenizer_fingerprint(corpus.fingerprint, SMALL)
    assert manifest.vocab_size == 400 and manifest.requested_vocab_size == 400

    tokenizer = Tokenizer.from_file(manifest.path)
    assert tokenizer.token_to_id("<|endoftext|>") == manifest.end_of_text_id
    text = "def décode(s):\n    return s  # ünïcode ✓\n"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text, "byte-level: any text round-trips"
    assert read_tokenizer_manifest(folder) == manifest
    assert not list((tmp_path / "tokenizers").glob(".*")), "no temporary folders left behind"


def test_training_is_deterministic_and_the_folder_follows_the_settings(corpus, tmp_path):
    first = train_tokenizer(corpus, SMALL, tmp_path / "a")
    again = train_tokenizer(corpus, SMALL, tmp_path / "b")
    assert again.sha256 == first.sha256 and again.fingerprint == first.fingerprint
    bigger = TokenizerConfig(vocab_size=450, min_frequency=2)
    assert tokenizer_fingerprint(corpus.fingerprint, bigger) != first.fingerprint
    assert tokenizer_fingerprint("another-corpus", SMALL) != first.fingerprint


def test_trains_on_the_train_split_only(tmp_path):
    def write(text: str, wanted: str) -> None:
        if split_of(text.encode(), 1337, 0.3, 0.2) == wanted:
            (tmp_path / "docs" / f"{len(list((tmp_path / 'docs').iterdir()))}.txt").write_text(text)

    (tmp_path / "docs").mkdir()
    for number in range(100):
        write(f"common words number {number} and more common words\n", "train")
        write(f"zyzzyvazyzzyva {number} " * 50, "validation")
        write(f"quokkaquokka {number} " * 50, "test")
    cfg = CorpusConfig(
        source="local", paths=[str(tmp_path / "docs")], validation_fraction=0.3, test_fraction=0.2
    )
    tokenizer = Tokenizer.from_file(train_tokenizer(open_corpus(cfg), SMALL, tmp_path).path)
    assert tokenizer.token_to_id("Ġcommon") is not None
    assert not any("yzz" in token for token in tokenizer.get_vocab()), "validation text taught nothing"
    assert not any("okk" in token for token in tokenizer.get_vocab()), "test text taught nothing"


def test_learns_from_a_bounded_seeded_sample_of_the_train_split(tmp_path, monkeypatch):
    monkeypatch.setattr("gptcore.data.corpus.UNIT_BYTES", 8192)  # many units to choose from
    paths = [str(STDLIB / "json" / "*.py"), str(STDLIB / "email" / "*.py")]
    corpus = open_corpus(
        CorpusConfig(source="local", paths=paths, validation_fraction=0.3, test_fraction=0.2)
    )
    whole = train_tokenizer(corpus, SMALL, tmp_path / "whole")
    assert whole.sample.sample_is_whole_train_split and whole.sample.sample_units == len(corpus.planned)

    bounded = SMALL.model_copy(update={"sample_bytes": 60_000})
    sample = train_tokenizer(corpus, bounded, tmp_path / "bounded").sample
    assert 60_000 <= sample.sample_bytes < whole.sample.sample_bytes / 3
    assert sample.sample_units < len(corpus.planned) / 3 and not sample.sample_is_whole_train_split
    assert train_tokenizer(corpus, bounded, tmp_path / "again").sample == sample, "seeded: the same sample"
    reseeded = train_tokenizer(corpus, bounded.model_copy(update={"sample_seed": 1}), tmp_path / "reseeded")
    assert reseeded.sample.sample_sha256 != sample.sample_sha256
    assert len({tokenizer_fingerprint(corpus.fingerprint, cfg) for cfg in (SMALL, bounded)}) == 2


def test_a_file_changed_after_training_is_detected(corpus, tmp_path):
    manifest = train_tokenizer(corpus, SMALL, tmp_path)
    Path(manifest.path).write_text("{}", encoding="utf-8")
    with pytest.raises(DataError, match=r"tokenizer.json: content differs from its manifest"):
        read_tokenizer_manifest(Path(manifest.path).parent)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"vocab_size": 256}, r"tokenizer.vocab_size: value 256 .* at least 257 \(256 bytes \+ 1 special"),
        ({"vocab_size": (1 << 32) + 1}, r"tokenizer.vocab_size: value 4294967297 .* at most 2\^32"),
        ({"end_of_text": ""}, r"tokenizer.end_of_text"),
    ],
)
def test_settings_outside_what_is_allowed_are_refused_before_training(corpus, tmp_path, settings, message):
    cfg = TokenizerConfig.model_construct(**{**SMALL.model_dump(), **settings})
    with pytest.raises(ConfigError, match=message):
        train_tokenizer(corpus, cfg, tmp_path)
    assert not (tmp_path / "tokenizers").exists() or not any((tmp_path / "tokenizers").iterdir())


def test_the_config_model_refuses_a_vocabulary_below_the_byte_alphabet():
    with pytest.raises(ValueError, match="vocab_size"):
        TokenizerConfig(vocab_size=200)
