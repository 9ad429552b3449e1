"""The model registry: the evaluated checkpoint as a version of `gptpipe-iteration-N`, and who is champion.

The evaluated checkpoint's logged model (found by its checkpoint's sha256, logged now when training
logged none, e.g. trained untracked) becomes a version of the registered model; registering the same
checkpoint again finds its version instead of adding one. The alias `champion` moves to it only when its
`test_bits_per_byte` beats the current champion's (or there is none); otherwise it gets `challenger`. The
decision and both figures are tags of the version.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHAMPION = "champion"
CHALLENGER = "challenger"


@dataclass(frozen=True)
class Registration:
    registered_model: str
    model_version: str
    model_id: str
    alias: str  # champion or challenger
    test_bits_per_byte: float
    champion_test_bits_per_byte: float | None  # the champion's before this decision (None: there was none)

    def figures(self) -> dict[str, Any]:
        return {
            "registered_model": self.registered_model,
            "model_version": self.model_version,
            "alias": self.alias,
            "previous_champion_test_bits_per_byte": self.champion_test_bits_per_byte,
        }


def registered_name(params: Any) -> str:
    return params.tracking.registered_model or f"gptpipe-iteration-{params.iteration}"


def evaluated_model(client: Any, experiment_id: str, run_id: str, checkpoint: Path, digest: str) -> Any:
    """The logged model of `checkpoint` (by its sha256), logged now into `run_id` when there is none."""
    from tasks.tracking.logged_models import log_checkpoint_model

    found = client.search_logged_models(
        [experiment_id], filter_string=f"tags.checkpoint_sha256 = '{digest}'", max_results=1
    )
    if found:
        return found[0]
    model_id = log_checkpoint_model(
        client, experiment_id, run_id, checkpoint, "evaluated", {"stage": "evaluate"}
    )
    return client.get_logged_model(model_id)


def register(
    client: Any,
    experiment_id: str,
    run_id: str,
    name: str,
    checkpoint: Path,
    test_bits_per_byte: float,
    digest: str | None = None,
) -> Registration:
    """Register `checkpoint` (its sha256 `digest`, computed when not given) as a version of `name`."""
    from mlflow.exceptions import MlflowException

    from gptcore.fingerprint import sha256_file

    digest = digest or sha256_file(checkpoint)
    model = evaluated_model(client, experiment_id, run_id, checkpoint, digest)
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(
            name, description="gptpipe models; @champion has the best test bits per byte"
        )
    version = _version_of(client, name, digest)
    if version is None:
        version = client.create_model_version(
            name,
            source=model.artifact_location,
            run_id=model.source_run_id,
            model_id=model.model_id,
            tags={
                "checkpoint_sha256": digest,
                "model_id": model.model_id,
                "test_bits_per_byte": str(test_bits_per_byte),
            },
        )
        _link_version(client, model, name, str(version.version))
    champion = _champion(client, name)
    best = float(champion.tags["test_bits_per_byte"]) if champion is not None else None
    wins = champion is None or str(champion.version) == str(version.version) or test_bits_per_byte < best
    alias = CHAMPION if wins else CHALLENGER
    client.set_registered_model_alias(name, alias, version.version)
    decision = {
        "decision": alias,
        "test_bits_per_byte": str(test_bits_per_byte),
        "champion_test_bits_per_byte": str(best) if best is not None else "none",
    }
    for key, value in decision.items():
        client.set_model_version_tag(name, version.version, key, value)
    return Registration(name, str(version.version), model.model_id, alias, test_bits_per_byte, best)


def _link_version(client: Any, model: Any, name: str, version: str) -> None:
    """Name the version on the logged model (as `mlflow.register_model` does), so the model pages' column
    *Registered models* shows it."""
    import json

    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    known = json.loads(client.get_logged_model(model.model_id).tags.get(MLFLOW_MODEL_VERSIONS, "[]"))
    known.append({"name": name, "version": version})
    client.set_logged_model_tags(model.model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(known)})


def _version_of(client: Any, name: str, digest: str) -> Any:
    found = client.search_model_versions(f"name = '{name}' and tags.checkpoint_sha256 = '{digest}'")
    return found[0] if found else None


def _champion(client: Any, name: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None
