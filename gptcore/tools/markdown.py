"""Markdown tables, one way: a header, rows of cells, and numbers written alike in every table."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def cell(value: Any, spec: str | None = None) -> str:
    """A value as a cell: `-` for none; a number by `spec` (a format spec such as `.2f` or `+.1%`), or
    else thousands-separated from 100 up and 4 significant digits below; anything else as text."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value).replace("|", "\\|")  # a pipe inside a cell would end it
    if spec is not None:
        return format(value, spec)
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.4g}"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """The table's lines (no trailing newline); a cell that is not text yet goes through `cell`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [value if isinstance(value, str) else cell(value) for value in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
