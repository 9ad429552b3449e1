"""Outbox records signed by the user's gptpipe: an HMAC of each record with a key only this user reads.

A replay uploads the files its records name (artifacts, checkpoints as logged models). A record gptpipe
wrote names what the run chose to log; a crafted outbox could name `~/.ssh/id_rsa`. So the writer signs
every record it leaves in an outbox (`sig`: HMAC-SHA256 of the record without it, keyed by
`~/.gptpipe/outbox.key`, made 0600 on first use), and a replay sends a record that reads a local file
only when its signature is this user's. Another user's outbox, or one written before records were
signed, keeps such records, refused; everything else in it (metrics, params, tags) is sent as before.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import tempfile
from contextlib import suppress
from functools import cache
from pathlib import Path

from tasks.tracking.delivery.records import OutboxRecord, R

READS_FILES = frozenset({"log_artifact", "log_model"})  # the records whose sending reads a local file
KEY_FILE = Path("~/.gptpipe/outbox.key")
KEY_BYTES = 32  # written as 64 hex characters


@cache
def _key() -> bytes:
    """This user's signing key: created once, whole (0600, never through a link), refused when anyone
    else could read or replace it, or when the file holds less than a whole key (a short key is a guessable
    one)."""
    path = KEY_FILE.expanduser()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not os.path.lexists(path):
        _create_key(path)
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(descriptor) as handle:
        info = os.fstat(handle.fileno())
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise PermissionError(f"{path}: must be this user's and readable by nobody else (chmod 600)")
        key = handle.read().strip().encode()
    if len(key) < 2 * KEY_BYTES or not _is_hex(key):  # an older gptpipe stopped between creating and writing
        raise PermissionError(
            f"{path}: holds {len(key)} characters, not a key of {2 * KEY_BYTES} hex digits; remove it and a "
            "new one is made"
        )
    return key


def _is_hex(key: bytes) -> bool:
    try:
        bytes.fromhex(key.decode("ascii"))
    except ValueError:  # UnicodeDecodeError included
        return False
    return True


def _create_key(path: Path) -> None:
    """A new key at `path`, whole from the moment it has that name: written to a file of its own in the
    same folder (0600), then linked to `path`. A link never replaces, so of processes making the key at
    once exactly one wins, and the others read the winner's whole key (a file created under its name
    and written afterwards would be read empty by a second process in between)."""
    descriptor, written = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600, O_EXCL
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_hex(KEY_BYTES))
            handle.flush()
            os.fsync(handle.fileno())  # whole on disk before it has its name, a crash included
        with suppress(FileExistsError):  # another process's key won: theirs is read
            os.link(written, path)
    finally:
        os.unlink(written)


def _digest(record: OutboxRecord) -> str:
    """The HMAC of the record's outbox line without its `sig`, its keys sorted."""
    line = {k: v for k, v in record.line().items() if k != "sig"}
    body = json.dumps(line, sort_keys=True, default=str)
    return hmac.new(_key(), body.encode(), hashlib.sha256).hexdigest()


def sign(record: R) -> R:
    return record.model_copy(update={"sig": _digest(record)})


def verified(record: OutboxRecord) -> bool:
    """Whether this user's gptpipe wrote `record` as it is."""
    return record.sig is not None and hmac.compare_digest(record.sig, _digest(record))
