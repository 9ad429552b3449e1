"""`@champion` under races: two registrations at the same moment (two sweep trials finishing together)
each read the champion before the other's better version existed; whatever the interleaving, the
champion ends on the best version. A racer killed right after a stale set leaves the worse one
`@champion` only until the next toucher of the registry (a registration, a reader of `@champion`, a
run's start, `gptpipe models`) settles it; only the version holding the alias is recorded champion."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tracking_support import fresh_store

from tasks.tracking.models import registry

ROUNDS = 12


def new_version(client: Any, name: str, bits: float) -> Any:
    return client.create_model_version(name, source="file:///nowhere", tags={"test_bits_per_byte": str(bits)})


def test_two_registrations_at_once_leave_the_better_as_champion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=fresh_store(tmp_path))
    read_champion = registry._champion

    def slow_reader(client: Any, name: str) -> Any:
        """Every registration reads the champion, then is overtaken before it writes: the race, made sure."""
        found = read_champion(client, name)
        time.sleep(0.05)
        return found

    monkeypatch.setattr(registry, "_champion", slow_reader)
    for round_ in range(ROUNDS):
        name = f"race-{round_}"
        client.create_registered_model(name)
        registry._decide(client, name, new_version(client, name, 2.0), 2.0, True, registry.CHALLENGER)
        better, worse = new_version(client, name, 1.5), new_version(client, name, 1.8)
        start = threading.Barrier(2)
        order = [(better, 1.5), (worse, 1.8)] if round_ % 2 else [(worse, 1.8), (better, 1.5)]

        def register(version: Any, bits: float, name: str = name, start: threading.Barrier = start) -> None:
            start.wait()
            registry._decide(client, name, version, bits, True, registry.CHALLENGER)

        threads = [threading.Thread(target=register, args=pair) for pair in order]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        champion = read_champion(client, name)
        assert str(champion.version) == str(better.version), f"round {round_}: {champion.version}"
        assert client.get_model_version(name, worse.version).tags["decision"] == registry.CHALLENGER


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
