"""A chat fine-tune's conversations by split, from the source its configuration names, and the
fingerprint of what determines them (a cache key: the same source, settings and code give the same one).

- `builtin:python-docstrings`: the standard library's docstrings (`gptcore.chat.docstrings`), split by
  top-level package.
- `local`: conversation files (`gptcore.chat.conversations`), every line checked before any is used;
  each conversation's split drawn by a hash of its text, so a file reordered splits the same.
- `hub`: a dataset of conversations (SmolTalk's form: a `messages` column), streamed where the hub is
  reachable, or a copy saved on disk; a bad row is named by its number."""

from __future__ import annotations

import itertools
import json
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path

from gptcore.chat import conversations as conversation_files
from gptcore.chat import docstrings
from gptcore.chat.config import BUILTIN_DOCSTRINGS, ChatDataConfig
from gptcore.chat.conversations import Conversation, parse
from gptcore.data.corpus import HubSource, expand_paths, hub_dataset, stdlib_files
from gptcore.errors import DataError
from gptcore.tools.fingerprint import code_version_of, fingerprint, sha256_file

SPLITS = docstrings.SPLITS


def conversation_splits(cfg: ChatDataConfig) -> dict[str, list[Conversation]]:
    """The source's conversations (its first `max_conversations`) by split, in the source's order."""
    if cfg.source == BUILTIN_DOCSTRINGS:
        root = Path(sysconfig.get_paths()["stdlib"])
        built = docstrings.build(
            stdlib_files(), root, cfg.validation_fraction, cfg.test_fraction, cfg.split_seed
        )
        return built if cfg.max_conversations is None else _first(built, cfg.max_conversations)
    found = _local(cfg) if cfg.source == "local" else _hub(cfg)
    splits: dict[str, list[Conversation]] = {split: [] for split in SPLITS}
    for conversation in itertools.islice(found, cfg.max_conversations):
        text = json.dumps(conversation.to_dict(), sort_keys=True)
        splits[docstrings.split_of(text, cfg.validation_fraction, cfg.test_fraction, cfg.split_seed)].append(
            conversation
        )
    return splits


def _first(splits: dict[str, list[Conversation]], most: int) -> dict[str, list[Conversation]]:
    """Each split's first conversations, its share of `most` (the builtin's splits are drawn by package
    before any conversation is counted)."""
    total = sum(len(items) for items in splits.values())
    return {split: items[: max(1, len(items) * most // total)] for split, items in splits.items()}


def _local(cfg: ChatDataConfig) -> Iterator[Conversation]:
    files = expand_paths(cfg.paths, "chat.paths")
    return iter(conversation_files.read_all(files))  # every line checked before any is used


def _hub(cfg: ChatDataConfig) -> Iterator[Conversation]:
    where = f"chat.hub_name {cfg.hub_name!r}"
    source = HubSource(cfg.hub_name or "", cfg.hub_config, cfg.hub_split, cfg.hub_revision, cfg.streaming)
    return _rows(hub_dataset(source, None, where, "chat"), cfg.messages_field, where)


def _rows(rows: Iterable[dict], field: str, where: str) -> Iterator[Conversation]:
    for number, row in enumerate(rows, 1):
        if field not in row:
            raise DataError(f"{where}: row {number} has no {field!r} column (chat.messages_field)")
        try:
            yield parse({"messages": row[field]})
        except ValueError as error:
            raise DataError(f"{where}: row {number}: {error}") from None


def source_fingerprint(cfg: ChatDataConfig) -> str:
    """What determines the conversations: the source's files by content (the builtin's: the standard
    library's sources), a hub dataset by name, configuration, split and revision; the settings and the
    code that reads them."""
    from gptcore.chat import conversations

    code = code_version_of(docstrings, conversations)
    settings = cfg.model_dump()
    if cfg.source == "hub":
        return fingerprint("chat", code, settings)
    files = stdlib_files() if cfg.source == BUILTIN_DOCSTRINGS else expand_paths(cfg.paths, "chat.paths")
    return fingerprint("chat", code, settings, [sha256_file(path) for path in files])
