"""The tokenizer stage: a byte-level BPE tokenizer trained on a sample of the corpus's train split,
cached on the corpus's content fingerprint and the tokenizer settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from gptcore.data.tokenizer import TokenizerManifest, tokenizer_fingerprint, train_tokenizer
from tasks.results import Record, StageResult, file_record
from tasks.stage import Stage
from tasks.stages.corpus import corpus_for, data_root


class CorpusSummary(BaseModel):
    """The corpus a tokenizer was trained on, as `gptcore.data.corpus.Corpus.to_dict` says it."""

    model_config = ConfigDict(frozen=True)

    fingerprint: str  # of its documents' content
    source: str | None = None  # for people: builtin:..., local:paths, hub:name/config:split
    format: str | None = None
    units: int | None = None  # the units it is cut into (None: a stream)
    source_bytes: int | None = None


class TokenizerResult(StageResult):
    tokenizer: Record[TokenizerManifest]
    corpus: CorpusSummary


@dataclass(frozen=True, kw_only=True)
class Tokenizer(Stage[TokenizerResult]):
    """Train the byte-level BPE tokenizer on a sample of the train split."""

    result_type = TokenizerResult
    name: str = "tokenizer"

    def key(self) -> tuple[Any, ...]:
        # hashes of file contents, never of paths or times: the corpus opened afresh at the run's start
        corpus = corpus_for(self.params.corpus, data_root(self.params), fresh=True).fingerprint
        return (tokenizer_fingerprint(corpus, self.params.tokenizer),)

    def compute(self, fingerprint: str | None) -> TokenizerResult:
        root = data_root(self.params)
        loaded = corpus_for(self.params.corpus, root)
        manifest = train_tokenizer(loaded, self.params.tokenizer, root)
        folder = Path(manifest.path).parent
        return TokenizerResult(
            fingerprint=fingerprint,
            tokenizer=manifest,
            corpus=CorpusSummary.model_validate(loaded.to_dict()),
            files={manifest.path: manifest.sha256, **file_record(folder / "manifest.json")},
            outputs=[manifest.path],
            figures={
                "vocab_size": manifest.vocab_size,
                "tokenizer_seconds": manifest.seconds,
                "tokenizer_sample_bytes": manifest.sample.sample_bytes or 0,
                "tokenizer_sample_documents": manifest.sample.sample_documents or 0,
            },
        )
