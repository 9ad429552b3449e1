"""The model a server serves, read from model files as data: safetensors (or `weights_only`) weights, the
architecture's JSON, `tokenizer.json`, the quantization's JSON. Nothing from the files is imported or
unpickled as code, whoever registered them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gptcore.chat.conversations import Conversation
from gptcore.data.config import TokenizerConfig
from gptcore.errors import ConfigError, DataError
from gptcore.export.model_files import ModelFiles
from gptcore.model.gpt import GPT


@dataclass
class ServedModel:
    """A model, its tokenizer and what a client is told of it."""

    name: str  # what clients send as `model` (the URI it was loaded from)
    model: GPT
    tokenizer: Any  # tokenizers.Tokenizer
    method: str  # fp32, bf16, int8-weight-only, ...
    end_of_text: int | None  # the token that ends a text, when the tokenizer has it
    chat_template: str | None = None  # a chat model's (`chat_template.jinja`); None: it cannot chat
    end_of_turn: int | None = None  # the token that ends a chat model's answer

    @property
    def window(self) -> int:
        return self.model.config.block_size

    def encode(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt).ids or [self.end_of_text or 0]  # an empty prompt: a start

    def encode_chat(self, conversation: Conversation) -> list[int]:
        """A chat request's messages in the template, ending on the prompt for the answer."""
        from gptcore.chat.template import encode

        return encode(self.tokenizer, conversation.messages, add_generation_prompt=True).ids


def check_files(files: ModelFiles, source: str) -> None:
    """Model files a gptpipe server reads: weights as tensors, settings as JSON; anything else is refused
    in one line naming `source` before a byte of it is loaded."""
    if files.missing():
        raise ConfigError(
            f"--model {source}: not a gptpipe model (no {', '.join(files.missing())} among its files)"
        )
    if files.weights.suffix not in (".safetensors", ".pt"):
        raise ConfigError(f"--model {source}: weights {files.weights.name} are not safetensors or tensors")
    try:
        json.loads(files.config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(
            f"--model {source}: {files.config.name} is not a model's settings ({error})"
        ) from None


def load_served(files: ModelFiles, name: str, device: str = "cpu") -> ServedModel:
    """The model the files hold on `device`, in the precision it was registered with."""
    from tokenizers import Tokenizer

    from gptcore.chat.template import END_OF_TURN, has_chat_tokens
    from gptcore.export.model_files import read_model_files

    check_files(files, name)
    model = read_model_files(
        files.weights, files.config, device, quantization=files.quantization, source=f"--model {name}"
    )
    try:
        tokenizer = Tokenizer.from_file(str(files.tokenizer))
    except Exception:  # the Rust loader raises a bare Exception for any malformed file
        raise DataError(f"--model {name}: {files.tokenizer.name} is not a loadable tokenizer") from None
    end_of_text = tokenizer.token_to_id(TokenizerConfig().end_of_text)
    template = files.chat_template.read_text(encoding="utf-8") if files.chat_template else None
    if template is not None and not has_chat_tokens(tokenizer):
        raise DataError(f"--model {name}: a chat template, but its tokenizer lacks the chat tokens")
    end_of_turn = tokenizer.token_to_id(END_OF_TURN) if template is not None else None
    return ServedModel(name, model, tokenizer, files.method, end_of_text, template, end_of_turn)
