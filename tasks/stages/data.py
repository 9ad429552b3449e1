"""The tokenizer and token-file stages: thin cached Prefect tasks over gptcore's data functions.

Each task is keyed on its content fingerprint (see `tasks.caching`) and returns its typed result
(`tasks.results`): output paths with their sha256 under `files`, the fingerprint, and headline
figures.
"""

from __future__ import annotations

from pathlib import Path

from gptcore.data.build import TokenFolderManifest, build_token_files, token_files_fingerprint
from gptcore.data.config import CorpusConfig, DataConfig, TokenizerConfig
from gptcore.data.corpus import Corpus, open_corpus
from gptcore.data.tokenizer import TokenizerManifest, tokenizer_fingerprint, train_tokenizer
from tasks.caching import stage_task
from tasks.results import TokenizerResult, TokensResult, file_record

# The corpus opened once per process: hashing its files is the costly part, and the fingerprint the
# stages are keyed on must be the one of the files they then read.
_opened: dict[str, Corpus] = {}


def corpus_for(cfg: CorpusConfig, data_root: Path, fresh: bool = False) -> Corpus:
    """The corpus as this run opened it; `fresh` opens it again (a run's start: files may have changed
    since an earlier run of a long-lived process)."""
    key = cfg.model_dump_json() + str(Path(data_root).resolve())
    if fresh or key not in _opened:
        _opened.clear()
        _opened[key] = open_corpus(cfg, Path(data_root) / "datasets-cache")
    return _opened[key]


def tokenizer_stage_fingerprint(
    cfg: CorpusConfig, tokenizer: TokenizerConfig, data_root: Path
) -> tuple[str, str]:
    """(corpus fingerprint, tokenizer fingerprint): hashes of file contents, never of paths or times."""
    corpus_fp = corpus_for(cfg, data_root, fresh=True).fingerprint
    return corpus_fp, tokenizer_fingerprint(corpus_fp, tokenizer)


def tokens_stage_fingerprint(tokenizer: TokenizerResult, data: DataConfig) -> str:
    manifest = TokenizerManifest.from_dict(tokenizer.tokenizer)
    return token_files_fingerprint(manifest.corpus_fingerprint, manifest, data)


@stage_task("tokenizer")
def tokenizer_task(
    fingerprint: str, corpus: CorpusConfig, tokenizer: TokenizerConfig, data_root: str, corpus_fp: str
) -> TokenizerResult:
    """Train the byte-level BPE tokenizer on a sample of the train split."""
    loaded = corpus_for(corpus, Path(data_root))
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
            "tokenizer_sample_bytes": manifest.sample.get("sample_bytes", 0),
            "tokenizer_sample_documents": manifest.sample.get("sample_documents", 0),
        },
    )


@stage_task("tokens")
def tokens_task(
    fingerprint: str,
    corpus: CorpusConfig,
    data: DataConfig,
    tokenizer_result: TokenizerResult,
    data_root: str,
) -> TokensResult:
    """Encode train, validation and test into sharded token files with their manifests."""
    tokenizer = TokenizerManifest.from_dict(tokenizer_result.tokenizer)
    loaded = corpus_for(corpus, Path(data_root))
    built: TokenFolderManifest = build_token_files(loaded, tokenizer, Path(data_root), data=data)
    folder = Path(built.directory)
    files = {}
    for split in built.files.values():
        files.update({str(folder / shard["file"]): shard["sha256"] for shard in split.shards})
        files.update(file_record(split.manifest_path))
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
            "train_documents": built.train.documents,
            "validation_documents": built.validation.documents,
            "test_documents": built.test.documents,
            "train_tokens": built.train.tokens,
            "validation_tokens": built.validation.tokens,
            "test_tokens": built.test.tokens,
            "tokens_per_second": built.tokens_per_second,
            "encoder": built.encoder,
            "tokens_seconds": built.seconds,
            "train_shards": len(built.train.shards),
        },
    )
