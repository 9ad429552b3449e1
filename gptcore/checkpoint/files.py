"""Checkpoints: everything an exact resume needs, written so that a crash never leaves a half file.

A checkpoint directory holds, per checkpoint, `<name>.pt` (tensors and state, loaded with
`torch.load(weights_only=True)`) and `<name>.json` (a sidecar with step, fingerprint, config, metadata
and the `.pt` file's sha256, cheap to read), plus `manifest.json` listing them. Names: `step-00000100`
for periodic checkpoints (the newest `keep_last` kept), `best` (lowest validation loss) and `final`.
Every file is written to a temporary name, fsynced, then renamed over the old one; the manifest last.

A checkpoint and its record are published as one unit, the weights' rename the one step between the
old and the new (`_publish`): the new record lands first, still describing the content it replaces
(`previous`) until that rename, so a kill at any moment leaves the checkpoint as it was or as it became,
whole. `checkpoint_metadata` is the one rule every reader takes a record by: the one whose sha256 the
file holds. An older gptpipe's pair, written without `previous`, reads as before.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gptcore.checkpoint.record import FORMAT_VERSION, CheckpointManifest, CheckpointRecord, ManifestEntry
from gptcore.errors import CheckpointError, first_line
from gptcore.tools.atomic import temporary_sibling, write_atomic
from gptcore.tools.disk_space import disk_full, is_disk_full
from gptcore.tools.faults import kill_point
from gptcore.tools.fingerprint import sha256_file, sha256_handle
from gptcore.tools.records import Settings

MANIFEST = "manifest.json"
# In a record published over another checkpoint of its name: the replaced content's record, readable
# until the new weights' rename ends the publishing (kept after it only by a kill in between).
PREVIOUS = "previous"
# What a `.pt` file holds: torch's state dicts (the model's, the optimizer's, ...), RNG states, the step;
# tensors and plain values, loaded with `weights_only=True`. Free-form: each part's owner reads its own.
State = dict[str, Any]
log = logging.getLogger(__name__)


# --- RNG states in forms weights_only loading accepts ---------------------------------------------


def capture_rng() -> State:
    version, state, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    return {
        "python": {"version": version, "state": torch.tensor(state, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(state: State) -> None:
    python = state["python"]
    random.setstate((python["version"], tuple(python["state"].tolist()), python["gauss"]))
    numpy = state["numpy"]
    keys = numpy["keys"].numpy().astype(np.uint32)
    np.random.set_state((numpy["kind"], keys, numpy["position"], numpy["has_gauss"], numpy["cached"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- atomic files ---------------------------------------------------------------------------------


def _fsync_directory(directory: Path) -> None:
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # platforms without directory descriptors
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_json(target: Path, value: Any, before_rename: Callable[[], None] | None = None) -> None:
    write_atomic(
        target,
        lambda handle: handle.write(json.dumps(value, indent=2, sort_keys=True).encode()),
        before_rename=before_rename,
    )


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path}: unreadable checkpoint record ({type(error).__name__})") from None


# --- the directory --------------------------------------------------------------------------------


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Delete half-written temporaries a killed writer left (`.<name>.tmp-<pid>`). Call it only while
    holding the directory's run lock: then no live writer owns any of them."""
    stale = [p for p in Path(directory).glob(".*.tmp-*") if p.is_file()]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def read_manifest(directory: Path) -> CheckpointManifest:
    """The folder's manifest, its entries confined to the folder: an entry whose name or file is not a
    plain name there (`../x`, an absolute path) is dropped with a warning, never deleted or loaded."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return CheckpointManifest()
    manifest = _read_json(path)
    entries = manifest.get("checkpoints") if isinstance(manifest, dict) else None
    if not isinstance(entries, dict):
        raise CheckpointError(f"{path}: its checkpoints are not a mapping of names to entries")
    kept = {}
    for name, entry in entries.items():
        file = entry.get("file") if isinstance(entry, dict) else None
        if not (_plain_name(name) and isinstance(file, str) and file == f"{name}.pt"):
            log.warning("warning: %s: entry %r names no file of this folder (%r); ignored", path, name, file)
            continue
        try:
            kept[name] = ManifestEntry(file, entry["sha256"], entry["step"], entry["kind"])
        except KeyError as missing:
            raise CheckpointError(f"{path}: entry {name!r} lacks {missing}") from None
    return CheckpointManifest(kept, manifest.get("format_version", FORMAT_VERSION))


def _plain_name(name: object) -> bool:
    """A file name of the folder itself: no separator, not `.` or `..`, not hidden."""
    return isinstance(name, str) and bool(name) and Path(name).name == name and not name.startswith(".")


def save_checkpoint(
    directory: Path, name: str, state: State, record: CheckpointRecord, keep_last: int | None = None
) -> tuple[Path, float]:
    """Write `<name>.pt`, its sidecar and the manifest; then prune periodic checkpoints beyond
    `keep_last`. Returns (path, seconds taken). A failing write leaves the previous files intact."""
    started = time.perf_counter()
    directory = Path(directory)
    path = directory / f"{name}.pt"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        sidecar = _publish(path, state, record)
        manifest = read_manifest(directory)
        manifest.checkpoints[name] = ManifestEntry.of(sidecar)
        _write_json(
            directory / MANIFEST, asdict(manifest), lambda: kill_point("checkpoint-manifest", record.step)
        )
        _fsync_directory(directory)
    except OSError as error:
        _forget_unlisted(directory, name)
        previous = latest_checkpoint(directory)  # the manifest lists what it did before the failed save
        kept = f"the previous checkpoint {previous} is kept" if previous else "no earlier checkpoint exists"
        if is_disk_full(error):
            advice = f"{kept}; free space and resume with --resume"
            raise disk_full(path, state_bytes(state), advice) from None
        failed = error.strerror or error
        raise CheckpointError(f"{path}: checkpoint write failed ({failed}); {kept}") from None
    if keep_last is not None:
        _prune(directory, keep_last)
    return path, time.perf_counter() - started


def _publish(path: Path, state: State, record: CheckpointRecord) -> CheckpointRecord:
    """Write `path` and its record as one unit; returns the record. The weights are written to their
    temporary name, then the record (with the replaced content's, `previous`), then the weights renamed
    into place: until that rename the old checkpoint reads whole, after it the new one. The record is
    then written again without `previous`, which a kill before it leaves, harmless."""
    previous = _current_record(path)
    published: list[CheckpointRecord] = []

    def record_then_rename() -> None:  # the weights complete under their temporary name
        staged = temporary_sibling(path)
        sidecar = replace(
            record,
            name=path.stem,
            file=path.name,
            sha256=sha256_file(staged),
            bytes=staged.stat().st_size,
            format_version=FORMAT_VERSION,
            written_at=time.time(),
        )
        published.append(sidecar)
        written = sidecar.to_dict()
        _write_json(
            path.with_suffix(".json"),
            written if previous is None else {**written, PREVIOUS: previous.to_dict()},
            lambda: kill_point("checkpoint-record", record.step),
        )
        _fsync_directory(path.parent)  # the record on disk before the weights it describes replace the old
        kill_point("checkpoint-weights", record.step)

    write_atomic(path, lambda handle: torch.save(state, handle), before_rename=record_then_rename)
    if previous is not None:
        _write_json(path.with_suffix(".json"), published[0].to_dict())
    return published[0]


def _current_record(path: Path) -> CheckpointRecord | None:
    """The record of the content `path` holds now, kept readable while it is replaced; None without one."""
    if not path.is_file():
        return None
    try:
        return checkpoint_metadata(path)
    except CheckpointError:
        return None


def _forget_unlisted(directory: Path, name: str) -> None:
    """After a failed save: remove the files of `name` that reached their place before the manifest
    listed them (a new checkpoint's), so a full disk gets its space back and the folder reads as before."""
    try:
        listed = name in read_manifest(directory).checkpoints
    except CheckpointError:
        return
    if not listed:
        for suffix in (".pt", ".json"):
            (directory / f"{name}{suffix}").unlink(missing_ok=True)


def state_bytes(state: Any) -> int:
    """The bytes of every tensor in a (nested) checkpoint state: about its file's size."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(value) for value in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(value) for value in state)
    return 0


def _prune(directory: Path, keep_last: int) -> None:
    manifest = read_manifest(directory)
    periodic = sorted(
        (entry.step, name) for name, entry in manifest.checkpoints.items() if entry.kind == "step"
    )
    doomed = [name for _, name in periodic[:-keep_last]]
    if not doomed:
        return
    for name in doomed:
        del manifest.checkpoints[name]
    # Forget first, then delete: never list a missing file.
    _write_json(directory / MANIFEST, asdict(manifest))
    for name in doomed:
        (directory / f"{name}.pt").unlink(missing_ok=True)
        (directory / f"{name}.json").unlink(missing_ok=True)


def resume_candidates(directory: Path | None) -> list[Path]:
    """Periodic and final checkpoints the manifest lists and that exist, newest (highest step) first."""
    if directory is None or not Path(directory).is_dir():
        return []
    entries = read_manifest(Path(directory)).checkpoints.values()
    ranked = sorted(
        ((e.step, e.kind == "final", e.file) for e in entries if e.kind in ("step", "final")), reverse=True
    )
    return [Path(directory) / file for _, _, file in ranked if (Path(directory) / file).is_file()]


def latest_checkpoint(directory: Path | None) -> Path | None:
    """The checkpoint a resume continues from: the highest step among periodic and final ones."""
    candidates = resume_candidates(directory)
    return candidates[0] if candidates else None


# A checkpoint whose content is intact can still fail to load into a run: a tensor of another shape, a
# missing key, a state another torch wrote. These are the errors that says so.
LOAD_ERRORS = (RuntimeError, KeyError, ValueError, TypeError, IndexError, AttributeError)


def resume_from(
    directory: Path | None, restore: Callable[[Path, CheckpointRecord, State], None]
) -> Path | None:
    """Hand the newest checkpoint that loads to `restore(path, record, state)` and return its path.
    Newest first, a candidate is skipped when its record is missing or of another format, its content
    differs from its recorded sha256, it does not unpickle, or `restore` fails with one of `LOAD_ERRORS`;
    each skip is a warning naming it, the checkpoint resumed from and why. A CheckpointError `restore`
    raises (a refusal: another configuration) ends the search. None when the directory holds no
    checkpoint; a CheckpointError when none loads (nothing is deleted)."""
    failures: list[str] = []
    for path in resume_candidates(directory):
        try:
            record = checkpoint_metadata(path)
            _check_format(path, record)
            state = load_checkpoint(path)
        except CheckpointError as error:
            failures.append(str(error))
            continue
        try:
            restore(path, record, state)
        except LOAD_ERRORS as error:
            failures.append(
                f"{path}: does not load into this run ({type(error).__name__}: {first_line(error, 200)})"
            )
            continue
        for failure in failures:
            log.warning("warning: %s; resuming from %s instead", failure, path)
        return path
    if failures:
        raise CheckpointError(
            f"{directory}: no intact checkpoint to resume from (nothing was deleted): {'; '.join(failures)}"
        )
    return None


def load_latest_valid(directory: Path | None) -> tuple[Path, CheckpointRecord, State] | None:
    """(path, record, state) of the newest checkpoint that reads whole (see `resume_from`)."""
    found: list[tuple[Path, CheckpointRecord, State]] = []
    path = resume_from(directory, lambda *loaded: found.append(loaded))
    return found[0] if path is not None else None


def _check_format(path: Path, record: CheckpointRecord) -> None:
    """A record this gptpipe reads: its format version and the keys a resume needs."""
    version = record.format_version
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: its record is in checkpoint format {version}; this gptpipe reads {FORMAT_VERSION}"
        )
    needed = {"step": record.step, "config": record.config, "sha256": record.sha256}
    missing = [key for key, value in needed.items() if value is None]
    if missing:
        raise CheckpointError(f"{path}: its record lacks {', '.join(missing)} (an older or foreign format)")


def named_checkpoint(directory: Path, name: str) -> Path | None:
    path = Path(directory) / f"{name}.pt"
    return path if path.is_file() else None


def checkpoint_metadata(path: Path) -> CheckpointRecord:
    """The record of the checkpoint's content: step, epoch, kind, fingerprint, config, model config,
    metadata, sha256; no tensors. Its sidecar, or, while a publishing is in flight or was cut short (the
    sidecar carries `previous`), the one of the two records whose sha256 the file holds: only then is the
    file hashed."""
    path = Path(path)
    record, previous = _sidecar(path)
    if previous is not None and path.is_file() and sha256_file(path) == previous.get("sha256"):
        return CheckpointRecord.from_dict(previous, path.with_suffix(".json"))
    return CheckpointRecord.from_dict(record, path.with_suffix(".json"))


def _sidecar(path: Path) -> tuple[dict, dict | None]:
    """The sidecar's record of `path` and, while a publishing is in flight, the previous one it carries."""
    sidecar = path.with_suffix(".json")
    if not sidecar.is_file():
        raise CheckpointError(f"{path}: no checkpoint record {sidecar.name} beside it")
    record = _read_json(sidecar)
    if not isinstance(record, dict):
        raise CheckpointError(f"{sidecar}: unreadable checkpoint record (not a mapping)")
    previous = record.pop(PREVIOUS, None)
    return record, previous if isinstance(previous, dict) else None


def load_checkpoint(path: Path, verify: bool = True) -> State:
    """The state dict of a checkpoint, its content checked against the sha256 its record holds."""
    path = Path(path)
    if verify:
        return read_checkpoint(path)[0]
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    with open(path, "rb") as handle:
        return _unpickled(path, handle)


READS = 3  # a checkpoint published again while it was read is read again, at most this many times


def read_checkpoint(path: Path) -> tuple[State, CheckpointRecord]:
    """A checkpoint's state dict and the record of that very content: the file opened once, its bytes
    hashed and loaded through the one handle, and the record taken whose sha256 they have. A checkpoint
    published again meanwhile (training replacing `best` while an export reads it: a new file under the
    name, a new sidecar) is read again, never an old record paired with new weights."""
    path = Path(path)
    for _ in range(READS):
        read = _read_once(path)
        if read is not None:
            return read
    raise CheckpointError(f"{path}: checkpoint is corrupted (content sha256 differs from its record)")


def _read_once(path: Path) -> tuple[State, CheckpointRecord] | None:
    """The state and record of one opening of `path`; None when the record of its content is gone."""
    try:
        with open(path, "rb") as handle:  # a publish renames a new file in: this one stays what it was
            record = _record_with(path, sha256_handle(handle))
            if record is None:
                return None
            handle.seek(0)
            return _unpickled(path, handle), record
    except FileNotFoundError:
        raise CheckpointError(f"{path}: checkpoint not found") from None


def _record_with(path: Path, sha256: str) -> CheckpointRecord | None:
    """The sidecar's record of `path` whose content sha256 is `sha256` (its own, or while a publishing
    is in flight the previous one it carries); None when neither is. The hash is the caller's: the file
    is not read again."""
    for candidate in _sidecar(path):
        if candidate is not None and candidate.get("sha256") == sha256:
            return CheckpointRecord.from_dict(candidate, path.with_suffix(".json"))
    return None


def _unpickled(path: Path, handle: Any) -> State:
    try:
        return torch.load(handle, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many kinds for a damaged file
        raise CheckpointError(f"{path}: checkpoint cannot be loaded ({type(error).__name__})") from None


def damage(path: Path) -> str | None:
    """Why a checkpoint would not load (no record, content that differs from its recorded sha256: a
    damaged file, or an older gptpipe's write cut short between its two files); None when it is whole.
    It hashes the file, but loads no tensor."""
    try:
        record = checkpoint_metadata(path)
        if not Path(path).is_file():
            return f"{path}: checkpoint not found"
        if record.sha256 != sha256_file(path):
            return f"{path}: checkpoint is corrupted (content sha256 differs from its record)"
    except CheckpointError as error:
        return str(error)
    return None


def config_differences(stored: Settings, current: Settings) -> list[str]:
    """Keys whose values differ (or exist on one side only), as `key: stored -> current`."""
    keys = sorted(set(stored) | set(current))
    return [f"{k}: {stored.get(k)!r} -> {current.get(k)!r}" for k in keys if stored.get(k) != current.get(k)]
