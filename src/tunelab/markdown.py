"""Markdown for the reports tunelab writes (plan, report, bench suite): one table writer and the cell formats
they share. Torch-free."""

from __future__ import annotations

import math
from typing import Any

from .io import gib


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A GitHub-flavoured table's lines: the header, its rule, one line per row."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def num(value: Any, digits: int = 0) -> str:
    """A cell for a number: thousands separated, `n/a` for a missing or NaN one, yes/no for a flag."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return f"{value:,.{digits}f}"
    return str(value)


def gib_cell(value: Any) -> str:
    """A cell for a byte count in GiB, `n/a` when it was not recorded."""
    return "n/a" if value is None else gib(value)
