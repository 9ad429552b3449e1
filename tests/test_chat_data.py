"""Conversations as data: the OpenAI / Hugging Face form read from JSON lines and parquet, every bad line
refused with its file and line; the standard library's docstrings as a chat corpus split by package."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gptcore.chat import conversations, docstrings
from gptcore.chat.conversations import Conversation
from gptcore.data.corpus import stdlib_files
from gptcore.errors import DataError

GOOD = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3 + 3?"},
        {"role": "assistant", "content": "6."},
    ]
}


def test_conversations_read_back_as_written_from_json_lines_and_parquet(tmp_path: Path) -> None:
    conversation = conversations.parse(GOOD)
    written = conversations.write([conversation, conversation], tmp_path / "chats.jsonl")
    assert list(conversations.read(written)) == [conversation, conversation]

    table = pa.table({"messages": [GOOD["messages"], GOOD["messages"][1:3]]})
    pq.write_table(table, tmp_path / "chats.parquet")
    read = list(conversations.read(tmp_path / "chats.parquet"))
    assert read == [conversation, Conversation(conversation.messages[1:3])]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"chats\.jsonl:3: not JSON"),
        (json.dumps({"text": "hello"}), r'chats\.jsonl:3: not an object with a "messages" list'),
        (json.dumps({"messages": [{"role": "bot", "content": "hi"}]}), r"message 0: role 'bot', allowed:"),
        (json.dumps({"messages": [{"role": "user", "content": " "}]}), r"message 0 \(user\): content must"),
        (json.dumps({"messages": GOOD["messages"][:2]}), r"the last message is the user's"),
        (
            json.dumps({"messages": [GOOD["messages"][1], GOOD["messages"][1], GOOD["messages"][2]]}),
            r"message 1 is user's where assistant's turn comes",
        ),
        (json.dumps({"messages": GOOD["messages"][1:3] + GOOD["messages"][:1]}), r"message 2 is system's"),
    ],
)
def test_a_bad_line_is_refused_in_one_line_naming_the_file_and_the_line(
    tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + line + "\n" + json.dumps(GOOD) + "\n")
    with pytest.raises(DataError, match=message) as refused:
        conversations.read_all([path])
    assert "\n" not in str(refused.value)


def test_a_bad_parquet_row_and_an_unknown_format_are_named(tmp_path: Path) -> None:
    pq.write_table(pa.table({"messages": [GOOD["messages"], GOOD["messages"][1:2]]}), tmp_path / "c.parquet")
    with pytest.raises(DataError, match=r"c\.parquet: row 2: the last message is the user's"):
        conversations.read_all([tmp_path / "c.parquet"])
    pq.write_table(pa.table({"text": ["hello"]}), tmp_path / "t.parquet")
    with pytest.raises(DataError, match=r"t\.parquet: no 'messages' column \(columns: text\)"):
        conversations.read_all([tmp_path / "t.parquet"])
    with pytest.raises(DataError, match=r"c\.csv: conversations are read from \.jsonl, \.json, \.parquet"):
        conversations.read_all([tmp_path / "c.csv"])


SOURCE = '''
"""A module."""

def dumps(obj, *, indent=None, sort_keys=False):
    """Serialize ``obj`` to a JSON formatted string.

    Longer details that are not part of the answer.
    """

class Decoder:
    """Simple JSON decoder that turns text into objects."""

    def __init__(self, *, strict=True):
        pass

def _private(x):
    """Never asked about, being private."""

def short():
    """Stub."""
'''


def test_docstrings_become_questions_answered_by_their_first_paragraph_and_their_signature(
    tmp_path: Path,
) -> None:
    for module in ("json/__init__.py", "json/decoder.py", "_private.py", "test/test_json.py"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text(SOURCE)
    splits = docstrings.build(sorted(tmp_path.rglob("*.py")), tmp_path, 0.0, 0.0)
    assert not splits["validation"] and not splits["test"]
    asked = {c.messages[1].content: c.messages[2].content for c in splits["train"]}
    assert asked["What does `json.dumps` do?"] == "Serialize ``obj`` to a JSON formatted string."
    signature = "`json.dumps(obj, *, indent=None, sort_keys=False)`"
    assert asked["Show the signature of `json.dumps`."] == signature
    assert asked["Show the signature of `json.decoder.Decoder`."] == "`json.decoder.Decoder(*, strict=True)`"
    assert "What does `json.short` do?" not in asked  # a stub's docstring is no answer
    assert "Show the signature of `json.short`." in asked
    assert not [question for question in asked if "_private" in question or "test." in question]
    assert all(c.messages[0].content == docstrings.SYSTEM for c in splits["train"])


def test_the_standard_librarys_corpus_splits_by_package_so_no_test_package_is_trained_on() -> None:
    root = Path(sysconfig.get_paths()["stdlib"])
    splits = docstrings.build(stdlib_files(), root)
    assert len(splits["train"]) > 1000 and splits["validation"] and splits["test"]

    def packages(split: str) -> set[str]:
        return {c.messages[1].content.split("`")[1].split(".")[0] for c in splits[split]}

    assert not packages("test") & packages("train") and not packages("validation") & packages("train")
    assert splits == docstrings.build(list(reversed(stdlib_files())), root)  # the same on every run


def test_local_files_and_a_saved_hub_dataset_split_the_same_conversations_the_same_way(
    tmp_path: Path,
) -> None:
    import datasets

    from gptcore.chat.config import ChatDataConfig
    from gptcore.chat.sources import conversation_splits, source_fingerprint

    asked = [
        Conversation.of([("user", f"What does `shlex.{name}` do?"), ("assistant", f"It is {name}.")])
        for name in ("split", "quote", "join", "shlex", "escape", "token", "lexer", "posix")
    ] * 5
    conversations.write(asked, tmp_path / "chats.jsonl")
    rows = [conversation.to_dict() for conversation in asked]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    settings = {"validation_fraction": 0.25, "test_fraction": 0.25}
    local = ChatDataConfig(source="local", paths=[str(tmp_path / "chats.jsonl")], **settings)
    hub = ChatDataConfig(source="hub", hub_name=str(tmp_path / "saved"), **settings)
    splits = conversation_splits(local)
    assert splits == conversation_splits(hub)
    assert sum(map(len, splits.values())) == 40 and all(splits.values())
    assert not set(splits["test"]) & set(splits["train"]), "the same text always lands in the same split"
    assert source_fingerprint(local) != source_fingerprint(local.model_copy(update={"split_seed": 7}))

    bad = [*rows[:3], {"messages": [{"role": "user", "content": "Hi?"}]}]
    datasets.Dataset.from_list(bad).save_to_disk(str(tmp_path / "bad"))
    with pytest.raises(DataError, match=r"chat.hub_name '.*bad': row 4: the last message is the user's"):
        conversation_splits(hub.model_copy(update={"hub_name": str(tmp_path / "bad")}))
    with pytest.raises(DataError, match=r"chat.paths\[0\] '.*missing.jsonl': no such file or folder"):
        conversation_splits(local.model_copy(update={"paths": [str(tmp_path / "missing.jsonl")]}))
