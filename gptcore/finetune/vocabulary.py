"""A base model made ready to learn the chat template: its tokenizer given the template's special tokens
(`gptcore.chat.template`), and its token embedding (and an untied output head) grown by a row for each
token the tokenizer gained, written as model files beside the template.

A new row starts as the mean of the base's rows: the model's first guesses at a new token are then the
average of what it already says (a new token's logit is about the mean logit, so it takes no probability
from the text the base predicts), where a random row could dominate them; training moves it from there.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer

from gptcore.chat.template import CHAT_TEMPLATE_FILE, JINJA, add_chat_tokens
from gptcore.export.model_files import (
    TOKENIZER,
    ModelFiles,
    read_model_files,
    write_model_files,
)
from gptcore.model.gpt import GPT


def grow_vocabulary(model: GPT, known: int, vocab_size: int) -> GPT:
    """`model` with at least `vocab_size` rows of embedding (and head), every row from `known` on the mean
    of the rows below it: the rows of the tokens its tokenizer had (a row past them, which the base kept
    for padding, was never a target and learned only to be unlikely)."""
    rows = max(vocab_size, model.config.vocab_size)
    grown = (
        GPT(model.config.model_copy(update={"vocab_size": rows})) if rows > model.config.vocab_size else model
    )
    state = model.state_dict()
    for name in ("transformer.wte.weight", "lm_head.weight"):
        old = state[name]
        mean = old[:known].mean(dim=0, keepdim=True)
        state[name] = torch.cat([old[:known], mean.expand(rows - known, -1)])
    grown.load_state_dict(state)
    return grown.eval()


def chat_model_files(base: ModelFiles, folder: Path) -> tuple[ModelFiles, int]:
    """The base's model files made ready for chat in `folder` (its tokenizer with the chat tokens, the
    model grown to them, `chat_template.jinja`); the files and how many tokens were added."""
    tokenizer = Tokenizer.from_file(str(base.tokenizer))
    known = tokenizer.get_vocab_size(with_added_tokens=True)
    added = add_chat_tokens(tokenizer)
    model = read_model_files(base.weights, base.config, quantization=base.quantization)
    if added:  # a base that has the tokens (a chat model fine-tuned again) keeps its rows
        model = grow_vocabulary(model, known, tokenizer.get_vocab_size(with_added_tokens=True))
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / TOKENIZER))
    (folder / CHAT_TEMPLATE_FILE).write_text(JINJA, encoding="utf-8")
    return write_model_files(model, folder / TOKENIZER, folder), added
