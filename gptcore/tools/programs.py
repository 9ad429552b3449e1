"""Programs this project starts, as a person may name them: an environment variable holding a command
(`nice -n 10 gptpipe`, `numactl --interleave=all python`), split as a shell splits it."""

from __future__ import annotations

import os
import shlex

from gptcore.errors import ConfigError


def configured_program(variable: str) -> list[str] | None:
    """The command `variable` names, split as a shell splits it; None where it is unset or blank. A value
    a shell could not split is refused in one line."""
    configured = os.environ.get(variable, "")
    if not configured.strip():
        return None
    try:
        return shlex.split(configured)
    except ValueError as error:
        raise ConfigError(
            f"{variable}={configured!r}: {error}; give a command as a shell would take it"
        ) from None
