"""`gptpipe tracking replay`, against a real store: what the store refuses stays (exit 1), a killed
replay resumes without a second run or metric, two replays never run at once, a crafted outbox cannot
upload a local file, and the store is the one the outbox was written for."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tracking_support import fresh_store

from flows.cli.main import main
from tasks.tracking.delivery import operations, signing
from tasks.tracking.delivery.operations import dumps, metric
from tasks.tracking.delivery.outbox import Outbox
from tasks.tracking.delivery.signing import sign

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_store_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


class Store:
    def __init__(self, folder: Path) -> None:
        from mlflow import MlflowClient

        self.uri = fresh_store(folder)
        self.client = MlflowClient(tracking_uri=self.uri)
        # Its files beside it: MLflow's own default is the working folder's mlruns/, the repository's.
        artifacts = (folder / "mlruns" / "artifacts").resolve().as_uri()
        self.experiment = self.client.create_experiment("replayed", artifact_location=artifacts)


def signature(line: dict[str, Any]) -> str:
    """The HMAC every gptpipe that signed its outbox put on a line: of the line without `sig`, its keys
    sorted, keyed by this user's key."""
    body = json.dumps({k: v for k, v in line.items() if k != "sig"}, sort_keys=True, default=str)
    return hmac.new(signing._key(), body.encode(), hashlib.sha256).hexdigest()


def outbox_of(path: Path, uri: str, lines: list[dict[str, Any]], signed: bool = True) -> Path:
    """An outbox of `lines`, each a record's JSON as gptpipe has written it (before the records were typed
    too), signed as this user's unless not `signed`."""
    box = Outbox(path, uri)
    box.append(json.dumps({**line, "sig": signature(line)} if signed else line) for line in lines)
    box.release()  # as the run that wrote it does when it ends
    return path


def create(key: str, experiment: str) -> dict[str, Any]:
    return {"op": "create_run", "run": key, "experiment_id": experiment, "run_name": "lost",
            "tags": {}, "start_time": int(time.time() * 1000)}  # fmt: skip


def losses(run: str, steps: range) -> list[dict[str, Any]]:
    return [{"op": "metric", "run": run, "key": "loss", "value": 1.0 / step, "timestamp": 1000 * step,
             "step": step} for step in steps]  # fmt: skip


def replay(path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    before = os.environ.get("MLFLOW_TRACKING_URI")
    code = main(["tracking", "replay", str(path), *args])
    said = capsys.readouterr()
    # The store it chose is its own: once, a replay's store left in this process's environment was the
    # store of the next test's `mlflow server` (MLFLOW_TRACKING_URI wins over a configured store).
    assert os.environ.get("MLFLOW_TRACKING_URI") == before
    return code, said.out + said.err


def test_records_the_store_refuses_stay_in_the_outbox_listed_and_the_replay_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(tmp_path)
    run = store.client.create_run(store.experiment).info.run_id
    store.client.log_param(run, "lr", "0.001")
    changed = {"op": "log_params", "run": run, "params": {"lr": "0.002"}, "keep_existing": False}
    path = outbox_of(tmp_path / "box.jsonl", store.uri, [*losses(run, range(1, 4)), changed])
    code, said = replay(path, capsys)
    assert code == 1 and "the store refused 1: log_params (" in said and "kept in it" in said
    assert [m.step for m in store.client.get_metric_history(run, "loss")] == [1, 2, 3]
    kept = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    assert [(record["op"], record["params"]) for record in kept] == [("log_params", {"lr": "0.002"})]


def test_a_killed_replay_resumes_without_a_second_run_or_metric(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(tmp_path)
    key = "pending-0123456789abcdef"
    records = [create(key, store.experiment), *losses(key, range(1, 4))]
    records += [{"op": "set_tags", "run": key, "tags": {"phase": "a"}}, *losses(key, range(4, 7))]
    path = outbox_of(tmp_path / "box.jsonl", store.uri, records)
    created = operations.OPERATIONS["create_run"]

    def created_then_killed(*args: Any) -> str:
        created(*args)  # the store took it; the kill comes before the progress says so
        raise KeyboardInterrupt

    monkeypatch.setitem(operations.OPERATIONS, "create_run", created_then_killed)
    assert main(["tracking", "replay", str(path)]) != 0  # killed
    monkeypatch.setitem(operations.OPERATIONS, "create_run", created)
    sent_tags = operations.OPERATIONS["set_tags"]

    def killed_at_the_tags(*args: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setitem(operations.OPERATIONS, "set_tags", killed_at_the_tags)
    assert main(["tracking", "replay", str(path)]) != 0  # the run found again, first losses sent, killed
    monkeypatch.setitem(operations.OPERATIONS, "set_tags", sent_tags)
    code, said = replay(path, capsys)
    assert code == 0, said
    runs = store.client.search_runs([store.experiment])
    assert len(runs) == 1, "one run, however many times its creation was replayed"
    assert [m.step for m in store.client.get_metric_history(runs[0].info.run_id, "loss")] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]
    assert runs[0].data.tags["phase"] == "a" and not path.exists()
    assert not path.with_name("box.jsonl.progress.json").exists()


def test_two_replays_of_one_outbox_at_once_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(tmp_path)
    run = store.client.create_run(store.experiment).info.run_id
    path = outbox_of(tmp_path / "box.jsonl", store.uri, losses(run, range(1, 3)))
    with Outbox.open(path).locked():
        code, said = replay(path, capsys)
    assert code == 2 and "in use by another replay or by the run still writing it" in said
    assert store.client.get_metric_history(run, "loss") == [] and path.exists()


def test_a_crafted_outbox_cannot_upload_a_local_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(tmp_path)
    run = store.client.create_run(store.experiment).info.run_id
    secret = tmp_path / "id_rsa"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----")
    upload = {"op": "log_artifact", "run": run, "path": str(secret), "folder": "loot"}
    path = outbox_of(tmp_path / "box.jsonl", store.uri, [*losses(run, range(1, 3)), upload], signed=False)
    code, said = replay(path, capsys)
    assert code == 1 and "not signed by this user's gptpipe, and it reads a local file" in said
    assert store.client.list_artifacts(run) == []
    assert [m.step for m in store.client.get_metric_history(run, "loss")] == [1, 2]  # the rest is sent
    assert [json.loads(line)["op"] for line in path.read_text().splitlines()[1:]] == ["log_artifact"]


def test_the_outbox_store_wins_over_the_environment_and_a_missing_experiment_stops_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    written_for, other = Store(tmp_path / "a"), Store(tmp_path / "b")
    run = written_for.client.create_run(written_for.experiment).info.run_id
    path = outbox_of(tmp_path / "box.jsonl", written_for.uri, losses(run, range(1, 3)))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", other.uri)
    code, said = replay(path, capsys)
    assert code == 0 and f"replaying into {written_for.uri}, the store the outbox was written for" in said
    assert len(written_for.client.get_metric_history(run, "loss")) == 2

    lost = outbox_of(tmp_path / "lost.jsonl", written_for.uri, [create("pending-aa", "99")])
    code, said = replay(lost, capsys)
    assert code == 2 and "its runs belong to experiment 99, which" in said and "nothing was sent" in said
    assert lost.exists()


def test_lines_nested_too_deep_or_too_long_are_passed_over_in_one_piece(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasks.tracking.delivery import outbox as outbox_module

    monkeypatch.setattr(outbox_module, "LINE_LIMIT", 4096)
    store = Store(tmp_path)
    run = store.client.create_run(store.experiment).info.run_id
    path = outbox_of(tmp_path / "box.jsonl", store.uri, losses(run, range(1, 3)))
    with path.open("a") as handle:
        handle.write("[" * 100_000 + "]" * 100_000 + "\n")  # deeper than the JSON reader goes
        handle.write(json.dumps({"op": "metric", "run": run, "pad": "x" * 10_000}) + "\n")  # too long
        handle.write(dumps(sign(metric(run, "loss", 0.25, 3000, 3))) + "\n")
    code, said = replay(path, capsys)
    assert code == 0 and "Traceback" not in said, said
    assert [m.step for m in store.client.get_metric_history(run, "loss")] == [1, 2, 3]


def test_an_outbox_of_every_kind_of_record_as_gptpipe_wrote_it_replays_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Lines as gptpipe has written them since outboxes were signed (a run created during the outage, its
    params, tags, files, text, JSON and end) are each sent once, and the outbox goes."""
    store = Store(tmp_path)
    key = "pending-00112233445566778899aabbccddeeff"
    notes = tmp_path / "notes.md"
    notes.write_text("# notes\n")
    lines = [
        create(key, store.experiment),
        {"op": "log_params", "run": key, "params": {"lr": "0.001"}, "keep_existing": False},
        {"op": "set_tags", "run": key, "tags": {"phase": "a"}},
        *losses(key, range(1, 3)),
        {"op": "log_artifact", "run": key, "path": str(notes), "folder": "outputs"},
        {"op": "log_text", "run": key, "text": "# summary\n", "file": "summary.md"},
        {"op": "log_dict", "run": key, "data": {"figures": {"loss": 0.5}, "note": None}, "file": "m.json"},
        {"op": "update_run", "run": key, "status": "RUNNING"},
        {"op": "set_terminated", "run": key, "status": "FINISHED", "end_time": int(time.time() * 1000)},
    ]
    path = outbox_of(tmp_path / "box.jsonl", store.uri, lines)
    code, said = replay(path, capsys)
    assert code == 0 and not path.exists(), said
    (run,) = store.client.search_runs([store.experiment])
    assert (run.info.run_name, run.info.status, run.data.params) == ("lost", "FINISHED", {"lr": "0.001"})
    assert run.data.tags["phase"] == "a" and run.data.tags["gptpipe.record_key"] == key
    assert [m.step for m in store.client.get_metric_history(run.info.run_id, "loss")] == [1, 2]
    files = {
        a.path for folder in ("", "outputs") for a in store.client.list_artifacts(run.info.run_id, folder)
    }
    assert {"outputs/notes.md", "summary.md", "m.json"} <= files


SECOND_FIRST_USE = "from tasks.tracking.delivery.signing import _key; print(_key().decode())"


def test_a_second_process_at_the_keys_first_use_reads_the_whole_key_the_first_one_signs_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two first uses of the signing key at once. The test holds the first where its key is drawn, which
    an older gptpipe did after creating the key file under its name (a second process then read it
    empty, and signed with an empty key), and runs a second process there: each reads one whole key."""
    monkeypatch.setenv("HOME", str(tmp_path))  # a user whose key does not exist yet
    folder = tmp_path / ".gptpipe"
    second: list[str] = []
    draw = signing.secrets.token_hex

    def draw_while_a_second_process_asks(nbytes: int) -> str:
        asked = subprocess.run(
            [sys.executable, "-c", SECOND_FIRST_USE], cwd=REPO, capture_output=True, text=True, check=True
        )
        second.append(asked.stdout.strip())
        return draw(nbytes)

    monkeypatch.setattr(signing.secrets, "token_hex", draw_while_a_second_process_asks)
    signing._key.cache_clear()
    try:
        first = signing._key().decode()
    finally:
        signing._key.cache_clear()  # the next test's key is its HOME's again
    assert second == [first] and len(bytes.fromhex(first)) == 32  # the one key, whole
    assert [p.name for p in folder.iterdir()] == ["outbox.key"]  # no other file left behind
    assert stat.S_IMODE((folder / "outbox.key").stat().st_mode) == 0o600


@pytest.mark.parametrize("written", ["", "0123abcd", "zz" * 32], ids=["empty", "short", "not-hex"])
def test_a_key_file_holding_less_than_a_whole_key_is_refused_in_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: str
) -> None:
    """A key file left empty or cut short (a kill or a full disk while an older gptpipe wrote it) would
    let anyone compute a valid signature: nothing is signed or verified with it."""
    monkeypatch.setenv("HOME", str(tmp_path))
    key = tmp_path / ".gptpipe" / "outbox.key"
    key.parent.mkdir(mode=0o700)
    key.write_text(written)
    key.chmod(0o600)
    signing._key.cache_clear()
    try:
        with pytest.raises(PermissionError) as refused:
            signing._key()
    finally:
        signing._key.cache_clear()
    assert str(refused.value) == (
        f"{key}: holds {len(written)} characters, not a key of 64 hex digits; remove it and a new one is made"
    )


def test_a_create_sent_again_after_its_answer_was_lost_finds_the_run_it_made(tmp_path: Path) -> None:
    """The writer's live retry and a replay send a create again when its answer never came (a timeout, a
    server stopped before it replied) though the store may have carried it out: one run either way."""
    from tasks.tracking.delivery.records import CreateRun

    store = Store(tmp_path)
    key = "pending-00000000000000aa"
    record = CreateRun(**create(key, store.experiment))
    first = operations.OPERATIONS["create_run"](store.client, key, record)  # its answer lost on the way
    again = operations.OPERATIONS["create_run"](store.client, key, record)
    assert again == first and len(store.client.search_runs([store.experiment])) == 1
    other = operations.OPERATIONS["create_run"](store.client, "pending-00000000000000bb", record)
    assert other != first, "another key is another run"
