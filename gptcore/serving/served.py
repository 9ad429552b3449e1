"""The model a server serves, read from model files as data: safetensors (or `weights_only`) weights, the
architecture's JSON, `tokenizer.json`, the quantization's JSON. Nothing from the files is imported or
unpickled as code, whoever registered them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

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

    @property
    def window(self) -> int:
        return self.model.config.block_size

    def encode(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt).ids or [self.end_of_text or 0]  # an empty prompt: a start


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
    return ServedModel(name, model, tokenizer, files.method, end_of_text)
