"""The base of every configuration: unknown keys are errors, values keep their types, nothing changes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Unknown keys are errors, values are not coerced across types, models are immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
