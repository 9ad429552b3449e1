"""The tokenizer and token-file stages: thin cached Prefect tasks over gptcore's data functions.

Each task is keyed on its content fingerprint (see `tasks.caching`) and returns its typed result
(`tasks.results`): output paths with their sha256 under `files`, the fingerprint, and headline
figures.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task

from gptcore.config import CorpusConfig, TokenizerConfig
from gptcore.data.build import TokenFolderManifest, build_token_files, token_files_fingerprint
from gptcore.data.corpus import Corpus, corpus_fingerprint, load_corpus
from gptcore.data.tokenizer import TokenizerManifest, tokenizer_fingerprint, train_tokenizer
from tasks.caching import fingerprint_key
from tasks.results import TokenizerResult, TokensResult, file_record

# One corpus load per process: the tokenizer and token stages of a run share it.
_loaded: dict[str, Corpus] = {}


def corpus_for(cfg: CorpusConfig, data_root: Path, expected_fingerprint: str | None = None) -> Corpus:
    if expected_fingerprint and expected_fingerprint in _loaded:
        return _loaded[expected_fingerprint]
    corpus = load_corpus(cfg, Path(data_root) / "datasets-cache")
    _loaded.clear()  # keep at most one corpus in memory
    _loaded[corpus.fingerprint] = corpus
    return corpus


def tokenizer_stage_fingerprint(cfg: CorpusConfig, tokenizer: TokenizerConfig) -> tuple[str, str]:
    """(corpus fingerprint, tokenizer fingerprint): hashes of file contents, never of paths or times."""
    corpus_fp = corpus_fingerprint(cfg)
    return corpus_fp, tokenizer_fingerprint(corpus_fp, tokenizer)


def tokens_stage_fingerprint(tokenizer: TokenizerResult) -> str:
    manifest = TokenizerManifest.from_dict(tokenizer.tokenizer)
    return token_files_fingerprint(manifest.corpus_fingerprint, manifest)


@task(name="tokenizer", cache_key_fn=fingerprint_key("tokenizer"), persist_result=True)
def tokenizer_task(
    fingerprint: str, corpus: CorpusConfig, tokenizer: TokenizerConfig, data_root: str, corpus_fp: str
) -> TokenizerResult:
    """Train the byte-level BPE tokenizer on the train split."""
    loaded = corpus_for(corpus, Path(data_root), corpus_fp)
    manifest = train_tokenizer(loaded, tokenizer, Path(data_root))
    folder = Path(manifest.path).parent
    return TokenizerResult(
        fingerprint=fingerprint,
        tokenizer=manifest.to_dict(),
        corpus=loaded.to_dict(),
        files={manifest.path: manifest.sha256, **file_record(folder / "manifest.json")},
        outputs=[manifest.path],
        figures={
            "vocab_size": manifest.vocab_size,
            "tokenizer_seconds": manifest.seconds,
            "train_documents": loaded.stats["train"].documents,
            "validation_documents": loaded.stats["validation"].documents,
            "test_documents": loaded.stats["test"].documents,
        },
    )


@task(name="tokens", cache_key_fn=fingerprint_key("tokens"), persist_result=True)
def tokens_task(
    fingerprint: str, corpus: CorpusConfig, tokenizer_result: TokenizerResult, data_root: str
) -> TokensResult:
    """Encode train, validation and test into token files with their manifests."""
    tokenizer = TokenizerManifest.from_dict(tokenizer_result.tokenizer)
    loaded = corpus_for(corpus, Path(data_root), tokenizer.corpus_fingerprint)
    built: TokenFolderManifest = build_token_files(loaded, tokenizer, Path(data_root))
    files = {}
    for token_file in built.files.values():
        files[token_file.path] = token_file.sha256
        files.update(file_record(token_file.manifest_path))
    return TokensResult(
        fingerprint=fingerprint,
        tokens=built.to_dict(),
        train=built.train.path,
        validation=built.validation.path,
        test=built.test.path,
        tokenizer_path=tokenizer.path,
        files=files,
        outputs=[built.train.path, built.validation.path, built.test.path],
        figures={
            "train_tokens": built.train.tokens,
            "validation_tokens": built.validation.tokens,
            "test_tokens": built.test.tokens,
            "tokens_per_second": built.tokens_per_second,
            "encoder": built.encoder,
            "tokens_seconds": built.seconds,
        },
    )
