"""What gptcore's typed records share: a run's flat settings (dotted names to JSON values, as a checkpoint
records what a resume must match), a JSON object as a file holds one, and a record read back from JSON
that may lack newer fields or hold fields of a newer gptpipe. Records are read by attribute."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar, Union

from pydantic import JsonValue

# One value of a flat setting as JSON holds it: a scalar, or a list (LoRA's targets).
Setting = Union[str, int, float, bool, None, list[Any]]  # noqa: UP007 - a runtime alias, not an annotation
# A run's settings, flat: `model.n_layer`, `optimizer.learning_rate`, `lora.r`, ... (tests/test_checkpoint).
Settings = dict[str, Setting]

# A JSON object as a file or a request holds it: what a record's `to_dict` writes and `from_dict` reads.
JSONObject = dict[str, JsonValue]

R = TypeVar("R")


def flatten(prefix: str, value: object, into: Settings) -> Settings:
    """`value`'s nested mappings as dotted names under `prefix`, added to `into` (returned)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            flatten(f"{prefix}.{key}" if prefix else str(key), item, into)
    else:
        into[prefix] = value  # type: ignore[assignment] - a leaf of JSON-like settings
    return into


def known_fields(cls: type, data: Mapping[str, object]) -> dict[str, object]:
    """The entries of `data` that are fields of the dataclass `cls`: a record of an older gptpipe lacks
    the newer ones (their defaults stand), a newer one's extra keys are passed over."""
    return {known.name: data[known.name] for known in fields(cls) if known.name in data}
