"""Where documents come from and how they become token files: the corpus, the tokenizer, the build."""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import Field, model_validator

from gptcore.tools.strict import Strict


class Sourced(Protocol):
    """A section that reads a source of text and splits it (`corpus`, a chat fine-tune's `chat`)."""

    source: str
    paths: list[str]
    hub_name: str | None
    validation_fraction: float
    test_fraction: float


def check_source(section: Sourced, name: str, paths_are: str, hub_is: str) -> None:
    """A ValueError naming the key of section `name` that its source lacks (local: `paths`, what they
    are; hub: `hub_name`, what it names), or the split fractions that leave nothing to train on."""
    if section.source == "local" and not section.paths:
        raise ValueError(f"source 'local' needs {name}.paths: {paths_are}")
    if section.source == "hub" and not section.hub_name:
        raise ValueError(f"source 'hub' needs {name}.hub_name: {hub_is}")
    if section.validation_fraction + section.test_fraction >= 1.0:
        raise ValueError(
            f"{name}.validation_fraction {section.validation_fraction} + {name}.test_fraction "
            f"{section.test_fraction} leave nothing to train on; their sum must be below 1"
        )


class CorpusConfig(Strict):
    """Where documents come from, and how they split into train, validation and test."""

    source: Literal["builtin:python-stdlib", "local", "hub"] = Field(
        default="builtin:python-stdlib",
        description="builtin:python-stdlib (this interpreter's standard library), local files, or a "
        "hub dataset",
    )
    paths: list[str] = Field(default_factory=list, description="files, folders or globs (local)")
    format: Literal["auto", "text", "jsonl", "parquet"] = Field(
        default="auto", description="how local files are read; auto: by each file's suffix"
    )
    text_field: str = Field(default="text", description="the column holding the text (jsonl, parquet, hub)")
    document_per: Literal["file", "line"] = Field(
        default="file", description="text files: a document per file or per non-empty line"
    )
    hub_name: str | None = Field(default=None, description="hub: the dataset's name")
    hub_config: str | None = Field(default=None, description="hub: the dataset's configuration")
    hub_split: str = Field(default="train", description="hub: the split read (gptpipe splits it again)")
    hub_revision: str | None = Field(
        default=None, description="a hub dataset's commit or tag: pins what a streamed source holds"
    )
    streaming: bool = Field(
        default=False,
        description="hub: read documents as they arrive (datasets' streaming mode), no full local copy; "
        "local files are always read a piece at a time",
    )
    validation_fraction: float = Field(
        default=0.05, gt=0.0, lt=1.0, description="of the documents, for validation during training"
    )
    test_fraction: float = Field(
        default=0.05, gt=0.0, lt=1.0, description="held out for the evaluate stage alone"
    )
    split_seed: int = Field(default=1337, description="which documents land in which split")
    max_documents: int | None = Field(default=None, ge=1, description="the first N non-empty documents")
    max_bytes: int | None = Field(
        default=None, ge=1, description="documents in source order until their UTF-8 text reaches N bytes"
    )

    @model_validator(mode="after")
    def _source_has_its_settings(self) -> CorpusConfig:
        check_source(self, "corpus", "a list of files, folders or globs", "a dataset name on the hub")
        return self


class TokenizerConfig(Strict):
    """The byte-level BPE tokenizer learned from the train split (`gptcore.data.tokenizer`)."""

    vocab_size: int = Field(
        default=8192, ge=257, le=1 << 32, description="tokens, the 256 bytes and the end-of-text one included"
    )
    min_frequency: int = Field(default=2, ge=1, description="a pair merges only when seen this often")
    end_of_text: str = Field(default="<|endoftext|>", description="the special token between documents")
    sample_bytes: int = Field(
        default=512 * 1024 * 1024,
        ge=1,
        description="BPE learns from a seeded sample of the train split of about this much text (the whole "
        "split when smaller), so its cost stops growing with the corpus",
    )
    sample_seed: int = Field(default=0, description="which parts of the corpus the sample reads")


class DataConfig(Strict):
    """How the token files are built: shard size, worker processes, and a token budget."""

    shard_tokens: int = Field(
        default=100_000_000, ge=256, description="tokens per shard file (the last of a split holds the rest)"
    )
    workers: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="encoding processes (None: one per core); never in the output",
    )
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="stop reading the corpus once the train split holds this many tokens (whole documents)",
    )
