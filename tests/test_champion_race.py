"""`@champion` under races: two registrations at the same moment (two sweep trials finishing together)
each read the champion before the other's better version existed; whatever the interleaving, the
champion ends on the best version."""

from __future__ import annotations

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
