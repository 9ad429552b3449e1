"""`@champion` under races: a registration (a sweep trial finishing beside another) that read the registry
before another's better version existed sets a stale `@champion`; the test makes that stale set land
after the better one's registration, and between its set and its read-back, and the champion still ends
on the best version. A racer killed right after a stale set leaves the worse one `@champion` only until
the next toucher of the registry (a registration, a reader of `@champion`, a run's start, `gptpipe
models`) settles it; only the version holding the alias is recorded champion."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from tracking_support import fresh_store

from tasks.tracking.models import registry

CEILING = 120.0  # a racer waits this long for the other at a named point: only a hang takes it


def new_version(client: Any, name: str, bits: float) -> Any:
    return client.create_model_version(name, source="file:///nowhere", tags={"test_bits_per_byte": str(bits)})


def registering(client: Any, name: str, bits: float) -> Any:
    """A version as a registration makes it (`registry._new_version`): measured, and not competing until
    its registration decides."""
    tags = {"test_bits_per_byte": str(bits), registry.MAY_HOLD: "false"}
    return client.create_model_version(name, source="file:///nowhere", tags=tags)


class Racer(threading.Thread):
    """`registry._decide` of one version on a thread of its own; what it raised, kept for the test."""

    def __init__(self, client: Any, name: str, version: Any, bits: float) -> None:
        super().__init__(name=f"registers version {version.version}")
        self.decide = (client, name, version, bits, True, registry.CHALLENGER)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            registry._decide(*self.decide)
        except BaseException as error:  # raised again by `finish`, on the test's thread
            self.error = error

    def finish(self) -> None:
        self.join(CEILING)
        assert not self.is_alive(), f"{self.name}: still running after {CEILING} s"
        if self.error is not None:
            raise self.error


@pytest.mark.parametrize(
    "lands", ["after the better's registration", "between the better's set and its check"]
)
def test_a_stale_champion_set_by_a_registration_that_read_before_the_better_existed_is_put_right(
    tmp_path: Path, lands: str
) -> None:
    """The worse version's registration reads the registry (version 1 champion, itself the best there),
    then stops at its stale set of `@champion` until the better version has been made and has registered
    (or has set `@champion` and stops before reading it back): the stale set lands there, as the slower
    of two trials finishing together would make it land."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=fresh_store(tmp_path))
    name = "race"
    client.create_registered_model(name)
    registry._decide(client, name, new_version(client, name, 2.0), 2.0, True, registry.CHALLENGER)
    worse = registering(client, name, 1.8)
    better: list[Any] = []  # made only once the worse one holds its stale pick
    stale_pick_held = threading.Event()
    stale_set_may_land = threading.Event()
    stale_set_landed = threading.Event()
    between = lands.startswith("between")
    set_alias = client.set_registered_model_alias

    def set_alias_at_named_points(model: str, alias: str, version: str) -> None:
        stale = alias == registry.CHAMPION and str(version) == str(worse.version)
        if stale and not stale_pick_held.is_set():  # the worse one's pick, read before the better existed
            stale_pick_held.set()
            assert stale_set_may_land.wait(CEILING), "the better registration never let the stale set land"
            set_alias(model, alias, version)
            stale_set_landed.set()
            return
        set_alias(model, alias, version)
        by_the_better = alias == registry.CHAMPION and better and str(version) == str(better[0].version)
        if between and by_the_better and not stale_set_may_land.is_set():  # its first set: its check waits
            stale_set_may_land.set()
            assert stale_set_landed.wait(CEILING), "the stale set never landed"

    client.set_registered_model_alias = set_alias_at_named_points
    slower = Racer(client, name, worse, 1.8)
    slower.start()
    assert stale_pick_held.wait(CEILING), "the worse registration never picked itself"
    better.append(registering(client, name, 1.5))
    faster = Racer(client, name, better[0], 1.5)
    faster.start()
    if not between:
        faster.finish()
        stale_set_may_land.set()
    faster.finish()
    slower.finish()
    assert stale_set_landed.is_set()  # the race happened as placed
    assert str(registry._champion(client, name).version) == str(better[0].version)
    assert decisions(client, name) == {"1": "challenger", "2": "challenger", "3": "champion"}


def test_a_quantized_version_competes_only_when_asked(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=fresh_store(tmp_path))
    client.create_registered_model("q")
    fp32 = new_version(client, "q", 2.0)
    registry._decide(client, "q", fp32, 2.0, True, registry.CHALLENGER)
    quantized = client.create_model_version(
        "q", source="file:///nowhere", tags={"test_bits_per_byte": "1.0", "quantization": "int8-weight-only"}
    )
    assert registry._decide(client, "q", quantized, 1.0, False, "int8-weight-only")[0] == "int8-weight-only"
    assert str(registry._champion(client, "q").version) == str(fp32.version)
    better_fp32 = new_version(client, "q", 1.9)
    assert registry._decide(client, "q", better_fp32, 1.9, True, registry.CHALLENGER)[0] == registry.CHAMPION


KILLED = 9  # the exit status of the racer killed right after its stale set


def stale_racer(uri: str, name: str, own: str, hidden: str, champion_then: str) -> None:
    """A registration of version `own` that read the registry before version `hidden` (better) existed,
    while `champion_then` held `@champion`, and whose process dies right after it points `@champion` at
    its stale pick: before it reads the alias back, before it records anything more."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    before = client.get_model_version(name, champion_then)
    searched = client.search_model_versions
    client.search_model_versions = lambda *a, **k: [v for v in searched(*a, **k) if str(v.version) != hidden]
    registry._champion = lambda client, name: before  # the champion as it was before `hidden` won
    set_alias = client.set_registered_model_alias

    def set_then_die(name: str, alias: str, version: str) -> None:
        set_alias(name, alias, version)
        if alias == registry.CHAMPION:
            os._exit(KILLED)

    client.set_registered_model_alias = set_then_die
    registry._decide(client, name, client.get_model_version(name, own), 1.8, True, registry.CHALLENGER)


def decisions(client: Any, name: str) -> dict[str, str]:
    """Each version's recorded decision (its `decision` tag), by version."""
    return {
        str(v.version): v.tags.get("decision", "") for v in client.search_model_versions(f"name = '{name}'")
    }


def first_two_registered(client: Any, name: str) -> tuple[Any, Any]:
    """Version 1 at 2.0 bits per byte, then version 2 at 1.5 (the better: `@champion`), both registered."""
    client.create_registered_model(name)
    first, better = new_version(client, name, 2.0), new_version(client, name, 1.5)
    for version, bits in ((first, 2.0), (better, 1.5)):
        registry._decide(client, name, version, bits, True, registry.CHALLENGER)
    return first, better


def test_a_racer_killed_right_after_a_stale_set_is_put_right_by_the_next_reader(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from tasks.tracking.models.model_uri import registered_version

    uri = fresh_store(tmp_path)
    client = MlflowClient(tracking_uri=uri)
    _, better = first_two_registered(client, "killed")
    worse = new_version(client, "killed", 1.8)
    racer = multiprocessing.get_context("spawn").Process(
        target=stale_racer, args=(uri, "killed", str(worse.version), str(better.version), "1")
    )
    racer.start()
    racer.join()
    assert racer.exitcode == KILLED
    assert str(registry._champion(client, "killed").version) == str(worse.version), "the stale set stands"

    read = registered_version(client, "models:/killed@champion")  # gptpipe generate, serve, export, ...
    assert str(read.version) == str(better.version)
    assert str(registry._champion(client, "killed").version) == str(better.version)
    assert decisions(client, "killed") == {"1": "challenger", "2": "champion", "3": ""}


def stale_champion(client: Any, name: str) -> tuple[Any, Any]:
    """The registry as a racer killed right after its stale set leaves it: version 3 (1.8) holds
    `@champion` though version 2 (1.5) is better, and both say `decision=champion`."""
    _, better = first_two_registered(client, name)
    worse = new_version(client, name, 1.8)
    client.set_registered_model_alias(name, registry.CHAMPION, worse.version)
    client.set_model_version_tag(name, worse.version, "decision", registry.CHAMPION)
    return better, worse


def register_a_third(client: Any, name: str, tmp_path: Path) -> None:
    third = new_version(client, name, 1.7)
    alias, champion_before, _ = registry._decide(client, name, third, 1.7, True, registry.CHALLENGER)
    assert (alias, champion_before) == (registry.CHALLENGER, 1.5), "compared with the real champion"


def read_champion(client: Any, name: str, tmp_path: Path) -> None:
    from tasks.tracking.models.model_uri import registered_version

    assert str(registered_version(client, f"models:/{name}@champion").version) == "2"


def start_a_run(client: Any, name: str, tmp_path: Path) -> None:
    from tasks.params.loading import load_params
    from tasks.tracking import PipelineRecorder

    path = tmp_path / "iteration.yaml"
    path.write_text(
        "iteration: 7\nmodel:\n  name: tiny\n  architecture: {n_layer: 1, n_head: 1, n_embd: 8, "
        "block_size: 8, vocab_size: 300}\n  cpu: {batch_size: 2}\n  gpu: {batch_size: 2}\n"
        "tokenizer: {vocab_size: 300}\n"
        f"tracking:\n  uri: {client.tracking_uri}\n  artifact_root: {tmp_path / 'art'}\n"
        f"  experiment: it-7\n  registered_model: {name}\n"
    )
    PipelineRecorder.start(load_params(path), path).finish(failed=False)


def list_the_models(client: Any, name: str, tmp_path: Path) -> None:
    """`gptpipe models NAME --json`: what it lists is who holds the alias, settled before it looked."""
    import contextlib
    import io
    import json

    from flows.cli.main import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["models", name, "--json"]) == 0
    listed = {line["model_version"]: line for line in map(json.loads, printed.getvalue().splitlines())}
    assert (listed["2"]["aliases"], listed["2"]["decision"]) == (["champion"], "champion")
    assert (listed["3"]["aliases"], listed["3"]["decision"]) == ([], "challenger")


@pytest.mark.parametrize("toucher", [register_a_third, read_champion, start_a_run, list_the_models])
def test_whoever_touches_the_registry_next_settles_the_champion_and_only_it_is_recorded_champion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toucher: Any
) -> None:
    from mlflow import MlflowClient

    uri = fresh_store(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # a run's store: the environment's wins over its file
    client = MlflowClient(tracking_uri=uri)
    better, worse = stale_champion(client, "stale")
    toucher(client, "stale", tmp_path)
    assert str(registry._champion(client, "stale").version) == str(better.version)
    recorded = decisions(client, "stale")
    assert [version for version, decision in recorded.items() if decision == registry.CHAMPION] == ["2"]
    assert recorded[str(worse.version)] == registry.CHALLENGER


def test_settling_is_idempotent_and_a_quantized_loser_keeps_its_method_as_its_decision(
    tmp_path: Path,
) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=fresh_store(tmp_path))
    client.create_registered_model("q")
    registry._decide(client, "q", new_version(client, "q", 2.0), 2.0, True, registry.CHALLENGER)
    quantized = client.create_model_version(
        "q", source="file:///nowhere", tags={"test_bits_per_byte": "1.9", "quantization": "bf16"}
    )
    assert registry._decide(client, "q", quantized, 1.9, True, "bf16")[0] == registry.CHAMPION
    registry._decide(client, "q", new_version(client, "q", 1.5), 1.5, True, registry.CHALLENGER)
    assert registry.settle_champion(client, "q") == registry.settle_champion(client, "q") == "3"
    assert decisions(client, "q") == {"1": "challenger", "2": "bf16", "3": "champion"}
