"""The chat template: how a conversation becomes token ids, the same in gptpipe and in transformers.

Each message is its role's special token, its content, and the end-of-turn token:

    <|system|>Be brief.<|end|><|user|>What is 2 + 2?<|end|><|assistant|>4.<|end|>

and a prompt for the model's answer ends on `<|assistant|>`; the answer ends where the model writes
`<|end|>`. The four tokens are special tokens of the tokenizer (added to a base's, whose embedding grows
to match), so the tokenizer splits on them before its BPE: every content is encoded on its own, which is
what `encode` does piece by piece, and what transformers' `apply_chat_template` with `JINJA` (stored as
`tokenizer_config.json`'s `chat_template`) does on the rendered text: the same ids either way, for every
content that does not hold a special token's string.

A content is text, whoever wrote it: `encode` reads a special token's string inside one (a user's
`hi<|end|><|system|>...`) as its characters, never as the token, so only the template opens and closes a
turn and no message speaks as another role (transformers' rendered text would parse them as tokens).

A fine-tune learns the assistant's turns alone: `Encoded.trained` marks each assistant content token and
the end-of-turn token after it (so the model learns to stop), never a role token or another's words."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tokenizers import AddedToken, Tokenizer

from gptcore.chat.conversations import Message
from gptcore.errors import DataError

ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
END_OF_TURN = "<|end|>"
SPECIAL_TOKENS = (*ROLE_TOKENS.values(), END_OF_TURN)
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # beside a chat model's tokenizer, as transformers names it

# transformers renders it in a sandboxed Jinja environment (trim_blocks, lstrip_blocks): no whitespace
# outside the tags, so the text is exactly `render`'s.
JINJA = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


@dataclass(frozen=True)
class Encoded:
    """A conversation's token ids, and which of them a fine-tune trains on."""

    ids: list[int]
    trained: list[bool]


def add_chat_tokens(tokenizer: Tokenizer) -> int:
    """Add the template's special tokens the tokenizer lacks (after its vocabulary, so a base's ids keep
    their meaning); returns how many were added."""
    missing = [token for token in SPECIAL_TOKENS if tokenizer.token_to_id(token) is None]
    return tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in missing]
    )


def has_chat_tokens(tokenizer: Tokenizer) -> bool:
    return all(tokenizer.token_to_id(token) is not None for token in SPECIAL_TOKENS)


def render(messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
    """The conversation as text, exactly as `JINJA` renders it."""
    text = "".join(f"{ROLE_TOKENS[m.role]}{m.content}{END_OF_TURN}" for m in messages)
    return text + (ROLE_TOKENS["assistant"] if add_generation_prompt else "")


def encode(tokenizer: Tokenizer, messages: Sequence[Message], add_generation_prompt: bool = False) -> Encoded:
    """The conversation's ids, piece by piece (the same as the rendered text's), and the trained mask:
    the assistant's content and its end-of-turn token."""
    if not has_chat_tokens(tokenizer):
        raise DataError(
            f"the tokenizer has no chat tokens ({', '.join(SPECIAL_TOKENS)}): a chat fine-tune adds them"
        )
    special = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    ids: list[int] = []
    trained: list[bool] = []
    as_text = _as_text(tokenizer)
    for message in messages:
        content = as_text.encode(message.content, add_special_tokens=False).ids
        learned = message.role == "assistant"
        ids += [special[ROLE_TOKENS[message.role]], *content, special[END_OF_TURN]]
        trained += [False, *([learned] * len(content)), learned]
    if add_generation_prompt:
        ids.append(special[ROLE_TOKENS["assistant"]])
        trained.append(False)
    return Encoded(ids, trained)


def _as_text(tokenizer: Tokenizer) -> Tokenizer:
    """`tokenizer` with every special token's string encoded as text (`encode_special_tokens`), as a copy:
    the original, shared with whatever encodes a completion's prompt, is never switched."""
    return _text_copy(tokenizer, tokenizer.get_vocab_size(with_added_tokens=True))


@lru_cache(maxsize=8)  # a server's models, a fine-tune's base; the size: a copy made before it grew is stale
def _text_copy(tokenizer: Tokenizer, size: int) -> Tokenizer:
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.encode_special_tokens = True
    return copy


def chat_template_of(folder: Path) -> str | None:
    """The chat template stored in a model's folder (None: a model without one cannot chat)."""
    path = Path(folder) / CHAT_TEMPLATE_FILE
    return path.read_text(encoding="utf-8") if path.is_file() else None


def fitting(tokenizer: Tokenizer, messages: Sequence[Message], window: int, room: int) -> list[Message]:
    """The latest turns of `messages` (a system message kept) whose prompt leaves `room` tokens of the
    `window` for the answer: the oldest exchanges go first, the last question never."""
    system = [m for m in messages[:1] if m.role == "system"]
    turns = list(messages[len(system) :])
    while len(turns) > 1 and len(encode(tokenizer, [*system, *turns], True).ids) + room > window:
        turns = turns[2:]  # a question and its answer
    return [*system, *turns]
