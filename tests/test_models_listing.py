"""`gptpipe models`: every version of a registered model, newest first, with who holds which alias (read
after settling `@champion`), its decision, test figure and split; an unknown name is one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from tracking_support import fresh_store

from tasks.tracking.models import registry
from tasks.tracking.models.listing import NoRegisteredModel, registered_versions, versions_table


def test_the_versions_are_listed_newest_first_with_the_aliases_they_hold(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=fresh_store(tmp_path))
    client.create_registered_model("listed")
    split = {"test_split": "0123456789abcdef"}
    for bits in ("2.5", "2.25"):
        version = client.create_model_version(
            "listed", source="file:///nowhere", tags={**split, "test_bits_per_byte": bits}
        )
        registry._decide(client, "listed", version, float(bits), True, registry.CHALLENGER)
    listed = registered_versions(client)
    assert [(v.model_version, v.aliases, v.decision, v.test_bits_per_byte) for v in listed] == [
        ("2", ("champion",), "champion", 2.25),
        ("1", (), "challenger", 2.5),
    ]
    assert versions_table(listed).splitlines()[2] == (
        "| listed | 2 | @champion | champion | 2.25 | 0123456789ab | - |"
    )
    with pytest.raises(
        NoRegisteredModel,
        match=r"^gptpipe models other: no registered model of that name; "
        r"registered: listed$",
    ):
        registered_versions(client, "other")
