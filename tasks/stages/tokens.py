"""The tokens stage: the corpus encoded with the run's tokenizer (trained by the tokenizer stage, or a
start model's own) into sharded, memory-mappable token files with their manifests; cached on the
tokenizer's and the corpus's fingerprints and the build settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptcore.data.build import TokenFolderManifest, build_token_files, token_files_fingerprint
from tasks.results import Record, StageResult, file_record
from tasks.stage import Stage
from tasks.stages.corpus import corpus_for, data_root
from tasks.stages.tokenizer import TokenizerResult


class SplitsResult(StageResult):
    """What the stages after the token files read of them: a split's token file each, and the tokenizer
    that made them (documents: `TokensResult`; conversations: `tasks.stages.chat_tokens`)."""

    train: str  # the token files the training stages read
    validation: str
    test: str  # held out: read by the evaluate stage alone
    tokenizer_path: str


class TokensResult(SplitsResult):
    tokens: Record[TokenFolderManifest]


@dataclass(frozen=True, kw_only=True)
class Tokens(Stage[TokensResult]):
    """Encode train, validation and test into sharded token files with their manifests."""

    result_type = TokensResult
    name: str = "tokens"
    tokenizer: TokenizerResult  # the tokenizer stage's, or a start model's (`BaseResult.tokenizer_result`)

    def key(self) -> tuple[Any, ...]:
        manifest = self.tokenizer.tokenizer
        return (token_files_fingerprint(manifest.corpus_fingerprint, manifest, self.params.data),)

    def compute(self, fingerprint: str | None) -> TokensResult:
        tokenizer = self.tokenizer.tokenizer
        root = data_root(self.params)
        loaded = corpus_for(self.params.corpus, root)
        built = build_token_files(loaded, tokenizer, root, data=self.params.data)
        return TokensResult(
            fingerprint=fingerprint,
            tokens=built,
            train=built.train.path,
            validation=built.validation.path,
            test=built.test.path,
            tokenizer_path=tokenizer.path,
            files=_files(built),
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


def _files(built: TokenFolderManifest) -> dict[str, str]:
    """Every shard with the sha256 its manifest recorded, and each split's manifest."""
    folder = Path(built.directory)
    files: dict[str, str] = {}
    for split in built.files.values():
        files.update({str(folder / shard.file): shard.sha256 for shard in split.shards})
        files.update(file_record(split.manifest_path))
    return files
