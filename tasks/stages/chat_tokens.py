"""A chat fine-tune's tokens stage: the conversations (`chat` section, `gptcore.chat.sources`) encoded in
the chat template with the base's tokenizer (the chat tokens added: `tasks.stages.finetune`), packed
into whole examples of the model's context with the loss mask on the answers (`gptcore.chat.tokens`);
cached on the conversations' fingerprint, the tokenizer and the context."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from gptcore.chat.tokens import MASK_SUFFIX, ChatTokenFolder, build_chat_tokens
from gptcore.data.tokenfile import manifest_path
from tasks.results import Record, file_record
from tasks.stage import Stage, announce
from tasks.stages.corpus import data_root
from tasks.stages.tokenizer import TokenizerResult
from tasks.stages.tokens import SplitsResult

CHAT_TOKENS = "chat-tokens"  # under paths.data_root


class ChatTokensResult(SplitsResult):
    chat: Record[ChatTokenFolder]


@dataclass(frozen=True, kw_only=True)
class ChatTokens(Stage[ChatTokensResult]):
    """Encode the conversations' train, validation and test splits into packed examples, each token file
    with its loss mask and manifest."""

    result_type = ChatTokensResult
    name: str = "tokens"
    tokenizer: TokenizerResult  # the base's, with the chat tokens (`BaseResult.tokenizer_result`)
    block_size: int  # the model's context: an example is block_size + 1 tokens

    @cached_property
    def source(self) -> str:
        """The conversations' fingerprint: their files hashed once, for the key and the manifests."""
        from gptcore.chat.sources import source_fingerprint

        return source_fingerprint(self.params.chat_data())

    def key(self) -> tuple[Any, ...]:
        return ("chat-tokens", self.source, self.tokenizer.tokenizer.sha256, self.block_size)

    def compute(self, fingerprint: str | None) -> ChatTokensResult:
        from gptcore.chat.sources import conversation_splits

        tokenizer = Path(self.tokenizer.tokenizer.path)
        folder = data_root(self.params) / CHAT_TOKENS / str(fingerprint)
        splits = conversation_splits(self.params.chat_data())
        built = build_chat_tokens(splits, tokenizer, folder, self.source, self.block_size + 1)
        splits = built.splits
        announce(f"tokens: {described(built)}")
        streams = [Path(split.path) for split in splits.values()]
        written = [
            p
            for stream in streams
            for p in (stream, stream.with_name(stream.stem + MASK_SUFFIX), manifest_path(stream))
        ]
        figures: dict[str, Any] = {}
        for name, split in splits.items():
            figures |= {
                f"{name}_conversations": split.conversations,
                f"{name}_tokens": split.tokens,
                f"{name}_trained_tokens": split.trained_tokens,
            }
        figures["conversations_too_long"] = sum(split.too_long for split in splits.values())
        return ChatTokensResult(
            fingerprint=fingerprint,
            chat=built,
            train=splits["train"].path,
            validation=splits["validation"].path,
            test=splits["test"].path,
            tokenizer_path=str(tokenizer),
            files=file_record(*written),
            outputs=[str(p) for p in streams],
            figures=figures,
        )


def described(built: ChatTokenFolder) -> str:
    """What the stage built, in one line: conversations by split, the examples' length, any left out."""
    splits = ", ".join(f"{name} {split.conversations} conversations" for name, split in built.splits.items())
    too_long = sum(split.too_long for split in built.splits.values())
    left_out = f"; {too_long} longer than an example left out" if too_long else ""
    return f"{splits}, packed in examples of {built.example_tokens} tokens{left_out}"
