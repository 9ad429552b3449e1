"""Conversations as data: the OpenAI / Hugging Face form, one JSON object a line,
`{"messages": [{"role": "system" | "user" | "assistant", "content": "..."}]}`, read from JSON-lines or
parquet files (a `messages` column of the same lists), every line checked, and written back the same way.

A conversation that a chat fine-tune can learn from: an optional system message first, then user and
assistant turns taking turns from a user's, ending on the assistant's (the turns it is trained to write).
A bad line is refused with its file and line (parquet: its row) in one sentence.

As OpenAI's API takes them: a content may be a list of text parts (`[{"type": "text", "text": "..."}]`,
which LangChain, Open WebUI and OpenAI's own helpers send), joined by newlines as vLLM joins them; a part
that is not text (an image, audio, a file) is refused by name. A `developer` message is the system
message, as OpenAI's newer models take it."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gptcore.errors import DataError
from gptcore.tools.atomic import write_text_atomic

Role = Literal["system", "user", "assistant"]
ROLES: tuple[Role, ...] = ("system", "user", "assistant")
AS_SYSTEM = "developer"  # OpenAI's name for the system message of its newer models
JSON_LINES = (".jsonl", ".json")
PARQUET = (".parquet",)


@dataclass(frozen=True)
class Message:
    role: Role
    content: str


@dataclass(frozen=True)
class Conversation:
    messages: tuple[Message, ...]

    def to_dict(self) -> dict[str, list[dict[str, str]]]:
        return {"messages": [{"role": m.role, "content": m.content} for m in self.messages]}

    @classmethod
    def of(cls, turns: Iterable[tuple[Role, str]]) -> Conversation:
        return cls(tuple(Message(role, content) for role, content in turns))


def parse(value: Any) -> Conversation:
    """A conversation from its JSON value, or ValueError saying in a few words what is wrong with it."""
    if not isinstance(value, dict) or not isinstance(value.get("messages"), list):
        raise ValueError('not an object with a "messages" list')
    messages = _messages(value["messages"])
    _check_turns(messages)
    return Conversation(tuple(messages))


def parse_prompt(value: Any) -> Conversation:
    """A chat request's messages (a list, as OpenAI's body holds them), which end on the user's turn the
    model answers; ValueError saying in a few words what is wrong with them."""
    if not isinstance(value, list):
        raise ValueError("expected a list of messages, each with a role and a content")
    messages = _messages(value)
    _check_turns(messages, last="user")
    return Conversation(tuple(messages))


def _messages(items: list[Any]) -> list[Message]:
    messages = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"message {index} is not an object")
        role = "system" if item.get("role") == AS_SYSTEM else item.get("role")
        if role not in ROLES:
            allowed = f"{ROLES[0]} (or {AS_SYSTEM}), {', '.join(ROLES[1:])}"
            raise ValueError(f"message {index}: role {item.get('role')!r}, allowed: {allowed}")
        content = _text(item.get("content"), f"message {index} ({role})")
        if not content.strip():
            raise ValueError(f"message {index} ({role}): content must be non-empty text")
        messages.append(Message(role, content))
    return messages


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, or the texts of a list of text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise ValueError(f"{where}: content must be non-empty text or a list of text parts")
    texts = []
    for number, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            shown = f"of type {kind!r}" if isinstance(kind, str) else "not a text part"
            raise ValueError(f"{where}: content part {number} is {shown}: this model reads text parts alone")
        texts.append(part["text"])
    return "\n".join(texts)


def _check_turns(messages: list[Message], last: Role = "assistant") -> None:
    """System first if at all, then user and assistant taking turns from a user's, ending on `last`'s:
    an assistant's for a conversation a fine-tune learns from, a user's for a question to answer."""
    turns = messages[1:] if messages and messages[0].role == "system" else messages
    if not turns:
        raise ValueError("no user or assistant message")
    for index, message in enumerate(turns):
        expected = "user" if index % 2 == 0 else "assistant"
        if message.role != expected:
            at = index + len(messages) - len(turns)
            raise ValueError(f"message {at} is {message.role}'s where {expected}'s turn comes")
    if turns[-1].role != last:
        why = "nothing to learn to answer" if last == "assistant" else "the model answers a user's message"
        raise ValueError(f"the last message is the {turns[-1].role}'s: {why}")


def read(path: Path) -> Iterator[Conversation]:
    """Every conversation of a JSON-lines or parquet file, in order (blank lines skipped); DataError
    naming the file and line (or row) at the first bad one."""
    suffix = path.suffix.lower()
    if suffix in JSON_LINES:
        yield from _json_lines(path)
    elif suffix in PARQUET:
        yield from _parquet(path)
    else:
        raise DataError(
            f"{path}: conversations are read from {', '.join(JSON_LINES + PARQUET)} files, not {suffix!r}"
        )


def read_all(paths: Iterable[Path]) -> list[Conversation]:
    """Every conversation of every file, all checked before any is used."""
    return [conversation for path in paths for conversation in read(path)]


def _json_lines(path: Path) -> Iterator[Conversation]:
    with path.open(encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                yield parse(json.loads(line))
            except json.JSONDecodeError as error:
                raise DataError(f"{path}:{number}: not JSON ({error.msg} at column {error.colno})") from None
            except ValueError as error:
                raise DataError(f"{path}:{number}: {error}") from None


def _parquet(path: Path) -> Iterator[Conversation]:
    import pyarrow.parquet as pq

    table = pq.ParquetFile(path)
    if "messages" not in table.schema_arrow.names:
        raise DataError(f"{path}: no 'messages' column (columns: {', '.join(table.schema_arrow.names)})")
    row = 0
    for batch in table.iter_batches(columns=["messages"]):
        for messages in batch.column("messages").to_pylist():
            row += 1
            try:
                yield parse({"messages": messages})
            except ValueError as error:
                raise DataError(f"{path}: row {row}: {error}") from None


def write(conversations: Iterable[Conversation], target: Path) -> Path:
    """The conversations as JSON lines, written whole or not at all."""
    lines = (json.dumps(c.to_dict(), ensure_ascii=False) for c in conversations)
    return write_text_atomic(target, "".join(f"{line}\n" for line in lines))
