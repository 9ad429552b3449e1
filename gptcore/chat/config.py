"""Where a chat fine-tune's conversations come from, and how they split into train, validation and test."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gptcore.data.config import check_source
from gptcore.tools.strict import Strict

BUILTIN_DOCSTRINGS = "builtin:python-docstrings"


class ChatDataConfig(Strict):
    """The conversations of a chat fine-tune (`gptcore.chat.sources`)."""

    source: Literal["builtin:python-docstrings", "local", "hub"] = Field(
        default=BUILTIN_DOCSTRINGS,
        description="builtin:python-docstrings (questions on this interpreter's standard library, answered "
        "by its docstrings), local files of conversations, or a hub dataset",
    )
    paths: list[str] = Field(
        default_factory=list,
        description="local: .jsonl, .json (one conversation a line) or .parquet files, folders or globs",
    )
    hub_name: str | None = Field(default=None, description="hub: the dataset's name, or a local saved copy")
    hub_config: str | None = Field(default=None, description="hub: the dataset's configuration")
    hub_split: str = Field(default="train", description="hub: the split read (gptpipe splits it again)")
    hub_revision: str | None = Field(default=None, description="hub: the commit or tag read")
    streaming: bool = Field(default=True, description="hub: read conversations as they arrive, no full copy")
    messages_field: str = Field(default="messages", description="hub: the column holding each conversation")
    validation_fraction: float = Field(
        default=0.1, gt=0.0, lt=1.0, description="of the conversations (the builtin's: of its packages)"
    )
    test_fraction: float = Field(
        default=0.1, gt=0.0, lt=1.0, description="held out for the evaluation alone, never trained on"
    )
    split_seed: int = Field(
        default=1337, description="which conversations land in which split (the builtin's split by package)"
    )
    max_conversations: int | None = Field(
        default=None, ge=1, description="the first N conversations of the source, before the split"
    )

    @model_validator(mode="after")
    def _source_has_its_settings(self) -> ChatDataConfig:
        paths_are, hub_is = "conversation files (.jsonl, .parquet)", "a dataset of conversations on the hub"
        check_source(self, "chat", paths_are, hub_is)
        return self
