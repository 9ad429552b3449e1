"""The registry as a person reads it (`gptpipe models`): each registered model's versions, newest first,
with the aliases they hold, the decision their registration recorded, their test figure and the test
split it was measured on. Listing touches the registry like any reader: `@champion` is settled first
(`registry.settle_champion`), so what is listed is who holds it, not who last claimed it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gptcore.errors import GptpipeError
from gptcore.tools.markdown import table
from gptcore.tools.records import JSONObject
from tasks.tracking.models.registry import DECISION
from tasks.tracking.models.test_split import TEST_SPLIT

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

    from tasks.params.schema import TrackingConfig


class NoRegisteredModel(GptpipeError):
    exit_code = 1


@dataclass(frozen=True)
class RegisteredVersion:
    """One version of a registered model; the field names are the registry's tag and figure names."""

    registered_model: str
    model_version: str
    aliases: tuple[str, ...]  # champion, challenger, a quantization method's
    decision: str | None  # champion on the alias's holder alone, else the alias its registration got
    test_bits_per_byte: float | None  # None: measured by nothing yet (an imported model)
    test_split: str | None  # the split's content fingerprint; None: registered before splits were named
    quantization: str | None  # the method of a quantized version; None: floating point
    run_id: str | None  # the MLflow run that logged it
    created: str  # UTC, ISO 8601 to the second

    def to_dict(self) -> JSONObject:
        return {**asdict(self), "aliases": list(self.aliases)}


def list_versions(config: TrackingConfig, name: str | None = None) -> list[RegisteredVersion]:
    """`registered_versions` in the store the parameter file's `tracking` section names."""
    from tasks.tracking.store import connect, resolve_target

    return registered_versions(connect(resolve_target(config)), name)


def registered_versions(client: MlflowClient, name: str | None = None) -> list[RegisteredVersion]:
    """Every version of `name` (None: of every registered model), `@champion` settled first in each."""
    from tasks.tracking.models.model_uri import settle_for_reading

    known = _names(client)
    if name is not None and name not in known:
        registered = ", ".join(known) or "none yet (gptpipe run registers one)"
        said = f"gptpipe models {name}: no registered model of that name; registered: {registered}"
        raise NoRegisteredModel(said)
    versions = []
    for each in [name] if name is not None else known:
        settle_for_reading(client, each)
        held = client.get_registered_model(each).aliases  # {alias: version}: searches leave them out
        found = client.search_model_versions(f"name = '{each}'")
        versions += sorted((_version(v, held) for v in found), key=lambda v: -int(v.model_version))
    return versions


def versions_table(versions: list[RegisteredVersion]) -> str:
    """The versions as a Markdown table, a row each (the split shortened to 12 characters)."""
    header = ["model", "version", "aliases", "decision", "test bits/byte", "test split", "quantization"]
    return table(header, [_row(version) for version in versions])


def _row(v: RegisteredVersion) -> list[Any]:
    aliases = ", ".join(f"@{alias}" for alias in v.aliases) or None
    split = v.test_split[:12] if v.test_split else None
    return [
        v.registered_model,
        v.model_version,
        aliases,
        v.decision,
        v.test_bits_per_byte,
        split,
        v.quantization,
    ]


def _names(client: MlflowClient) -> list[str]:
    """Every registered model's name, through all pages."""
    names, token = [], None
    while True:
        page = client.search_registered_models(max_results=100, page_token=token)
        names += [model.name for model in page]
        token = page.token
        if not token:
            return sorted(names)


def _version(version: ModelVersion, held: dict[str, str]) -> RegisteredVersion:
    tags = version.tags
    try:
        bits = float(tags["test_bits_per_byte"])
    except (KeyError, ValueError):
        bits = None
    created = datetime.fromtimestamp(version.creation_timestamp / 1000, tz=UTC)
    return RegisteredVersion(
        registered_model=version.name,
        model_version=str(version.version),
        aliases=tuple(sorted(alias for alias, number in held.items() if str(number) == str(version.version))),
        decision=tags.get(DECISION),
        test_bits_per_byte=bits,
        test_split=tags.get(TEST_SPLIT) or None,
        quantization=tags.get("quantization"),
        run_id=version.run_id or None,
        created=created.strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
