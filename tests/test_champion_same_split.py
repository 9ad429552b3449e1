"""`@champion` compares bits per byte measured on one test split only: a version measured on other text
(a person pointed iteration 1 at their own corpus, keeping the registered model's name) neither takes
nor loses `champion`, and its tags say it was not compared."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from tracking_support import fresh_store

from tasks.tracking.models import registry

ONE, OTHER = "1111aaaa2222bbbb", "3333cccc4444dddd"  # two test splits' fingerprints


@pytest.fixture
def client(tmp_path: Path) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=fresh_store(tmp_path))


def registered(client: Any, bits: float, split: str | None, name: str = "split") -> registry.Registration:
    """A checkpoint measured at `bits` on test split `split` (None: by a gptpipe that named none),
    registered through `registry.register`."""
    found = client.get_experiment_by_name("splits")
    experiment_id = found.experiment_id if found else client.create_experiment("splits")
    run = client.create_run(experiment_id).info.run_id
    model = client.create_logged_model(experiment_id, source_run_id=run, name="evaluated")
    digest = hashlib.sha256(f"{bits} {split}".encode()).hexdigest()  # a checkpoint's
    tags = {"test_split": split, "corpus_fingerprint": f"corpus-of-{split}"} if split else None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry, "evaluated_model", lambda *_: model)
        return registry.register(client, experiment_id, run, name, Path("x.pt"), bits, digest, split=tags)


def champion(client: Any, name: str = "split") -> str:
    return str(client.get_model_version_by_alias(name, registry.CHAMPION).version)


def test_a_version_measured_on_another_test_split_neither_takes_nor_loses_champion(client: Any) -> None:
    first = registered(client, 2.0, ONE)
    assert (first.alias, first.not_compared) == ("champion", None)
    elsewhere = registered(client, 1.0, OTHER)  # better bits per byte, on other text: not comparable
    refusal = f"not compared with the champion (version 1): measured on another test split {OTHER} vs {ONE}"
    assert (elsewhere.alias, elsewhere.not_compared) == ("challenger", refusal)
    assert elsewhere.champion_test_bits_per_byte is None and elsewhere.figures()["not_compared"] == refusal
    tags = client.get_model_version("split", elsewhere.model_version).tags
    assert (tags["decision"], tags["not_compared"], tags["test_split"]) == ("challenger", refusal, OTHER)
    assert tags["champion_test_bits_per_byte"] == "not compared" and champion(client) == "1"

    worse = registered(client, 2.5, ONE)  # the same split: compared as before
    assert (worse.alias, worse.champion_test_bits_per_byte, worse.not_compared) == ("challenger", 2.0, None)
    assert "not_compared" not in client.get_model_version("split", worse.model_version).tags
    better = registered(client, 1.5, ONE)  # beats the champion; the 1.0 on other text still does not count
    assert (better.alias, better.champion_test_bits_per_byte) == ("champion", 2.0)
    assert champion(client) == better.model_version
    assert client.get_model_version("split", elsewhere.model_version).tags["decision"] == "challenger"


def test_a_quantized_version_on_another_split_keeps_its_method_alias_and_says_why(client: Any) -> None:
    registered(client, 2.0, ONE, "q")
    version = client.create_model_version("q", source="file:///nowhere", tags={"quantization": "bf16"})
    alias, best, refused = registry._decide(
        client, "q", version, 0.5, True, "bf16", split={"test_split": OTHER}
    )
    assert (alias, best) == ("bf16", None) and refused.startswith(
        "not compared with the champion (version 1)"
    )
    assert champion(client, "q") == "1"


def test_versions_registered_before_splits_were_named_compare_only_with_each_other(client: Any) -> None:
    assert registered(client, 2.0, None).alias == "champion"
    assert registered(client, 1.9, None).alias == "champion"  # both name no split: compared as before
    tagged = registered(client, 1.0, ONE)
    assert tagged.alias == "challenger" and champion(client) == "2"
    assert tagged.not_compared == (
        f"not compared with the champion (version 2): measured on another test split {ONE} "
        "vs unknown (none named)"
    )
