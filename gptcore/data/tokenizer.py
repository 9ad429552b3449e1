"""Byte-level BPE tokenizer training with HF `tokenizers`, on a bounded sample of the train split.

The result is a `tokenizer.json` that `tokenizers.Tokenizer.from_file` (and
`transformers.PreTrainedTokenizerFast(tokenizer_file=...)`) loads, in a folder named by the fingerprint
of the corpus, the tokenizer settings (the sample's size and seed among them) and this code, with a
manifest beside it that records what the sample held (`gptcore.data.sample`).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from gptcore.data.config import TokenizerConfig
from gptcore.data.corpus import Corpus
from gptcore.data.sample import Sample, SampleRecord, sample_texts
from gptcore.errors import ConfigError, DataError
from gptcore.tools.atomic import publish_directory, staging_directory
from gptcore.tools.fingerprint import code_version_of, fingerprint, sha256_file
from gptcore.tools.records import JSONObject, known_fields

TOKENIZER_FILE = "tokenizer.json"
MANIFEST_FILE = "manifest.json"
BYTE_ALPHABET = 256
MAX_VOCAB = 1 << 32  # ids must fit the widest token-file dtype, uint32


@dataclass(frozen=True)
class TokenizerManifest:
    """The tokenizer folder's `manifest.json` (its keys the fields' names)."""

    fingerprint: str  # the folder's: corpus, settings, code and library (`tokenizer_fingerprint`)
    corpus_fingerprint: str  # the corpus it learned from
    path: str  # its tokenizer.json
    sha256: str  # tokenizer.json's content
    vocab_size: int  # as trained (at most the requested size)
    requested_vocab_size: int  # tokenizer.vocab_size
    min_frequency: int  # tokenizer.min_frequency
    end_of_text: str  # the separator token
    end_of_text_id: int  # its id
    seconds: float  # the training took
    tokenizers_version: str  # the library that trained it
    code_version: str  # the code that trained it
    sample: SampleRecord = field(default_factory=SampleRecord)  # what the sample held

    def to_dict(self) -> JSONObject:
        return {**asdict(self), "sample": self.sample.to_dict()}

    @classmethod
    def from_dict(cls, data: JSONObject) -> TokenizerManifest:
        known = known_fields(cls, data)
        return cls(**{**known, "sample": SampleRecord.from_dict(data.get("sample") or {})})


def _code_version() -> str:
    import gptcore.data.sample
    import gptcore.data.tokenizer

    return code_version_of(gptcore.data.tokenizer, gptcore.data.sample)


def tokenizer_fingerprint(corpus_fingerprint: str, cfg: TokenizerConfig) -> str:
    """Corpus + settings + this code + the library that trains: what decides `tokenizer.json`."""
    return fingerprint(
        "tokenizer", corpus_fingerprint, cfg.model_dump(), _code_version(), tokenizers.__version__
    )


def check_settings(cfg: TokenizerConfig) -> None:
    specials = [cfg.end_of_text]
    if not cfg.end_of_text:
        raise ConfigError("tokenizer.end_of_text: value '' is not allowed: the end-of-text token needs text")
    least = BYTE_ALPHABET + len(specials)
    if not least <= cfg.vocab_size <= MAX_VOCAB:
        raise ConfigError(
            f"tokenizer.vocab_size: value {cfg.vocab_size} is not allowed: it must be at least {least} "
            f"({BYTE_ALPHABET} bytes + {len(specials)} special token) and at most 2^32"
        )


def new_tokenizer() -> Tokenizer:
    """GPT-2's byte-level BPE: no normalizer, GPT-2 pre-tokenizer regex, no prefix space."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train_tokenizer(corpus: Corpus, cfg: TokenizerConfig, data_root: Path) -> TokenizerManifest:
    """Train on a sample of the train split and write `<data_root>/tokenizers/<fingerprint>/` atomically."""
    check_settings(cfg)
    key = tokenizer_fingerprint(corpus.fingerprint, cfg)
    final = Path(data_root) / "tokenizers" / key
    started = time.perf_counter()
    tokenizer = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=[cfg.end_of_text],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=sys.stderr.isatty(),
    )
    # The Rust trainer counts words on all cores; the iterator only hands it batches of strings.
    sample = Sample(cfg.sample_bytes)
    tokenizer.train_from_iterator(
        sample_texts(corpus, cfg.sample_bytes, cfg.sample_seed, sample), trainer=trainer
    )
    if sample.documents == 0:
        raise DataError(f"{corpus.source}: the corpus holds no train documents to learn a tokenizer from")
    end_of_text_id = tokenizer.token_to_id(cfg.end_of_text)
    if end_of_text_id is None:
        raise DataError(
            f"tokenizer training on {corpus.source} lost the end-of-text token {cfg.end_of_text!r}"
        )
    with staging_directory(final) as staging:
        tokenizer.save(str(staging / TOKENIZER_FILE))
        manifest = TokenizerManifest(
            fingerprint=key,
            corpus_fingerprint=corpus.fingerprint,
            path=str(final / TOKENIZER_FILE),
            sha256=sha256_file(staging / TOKENIZER_FILE),
            vocab_size=tokenizer.get_vocab_size(),
            requested_vocab_size=cfg.vocab_size,
            min_frequency=cfg.min_frequency,
            end_of_text=cfg.end_of_text,
            end_of_text_id=end_of_text_id,
            seconds=round(time.perf_counter() - started, 3),
            tokenizers_version=tokenizers.__version__,
            code_version=_code_version(),
            sample=sample.record(),
        )
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest.to_dict(), indent=2), encoding="utf-8")
        publish_directory(staging, final)
    return manifest


def read_tokenizer_manifest(folder: Path) -> TokenizerManifest:
    """The manifest of a trained tokenizer folder, checked against the file it describes."""
    path = Path(folder) / MANIFEST_FILE
    try:
        manifest = TokenizerManifest.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise DataError(f"{path}: tokenizer manifest not found") from None
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise DataError(f"{path}: unreadable tokenizer manifest ({type(error).__name__}: {error})") from None
    tokenizer_path = Path(manifest.path)
    if not tokenizer_path.is_file():
        raise DataError(f"{tokenizer_path}: tokenizer file not found (named by {path})")
    if sha256_file(tokenizer_path) != manifest.sha256:
        raise DataError(f"{tokenizer_path}: content differs from its manifest's sha256 ({path})")
    return manifest


def load_tokenizer(manifest: TokenizerManifest) -> Tokenizer:
    try:
        return Tokenizer.from_file(manifest.path)
    except Exception as error:  # the Rust side raises a plain Exception for a bad file
        raise DataError(f"{manifest.path}: not a loadable tokenizer.json ({_first_line(error)})") from None


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
