"""Inclusive integer ranges given on the command line: `1-8`, `64-512`, or one number for both ends."""

from __future__ import annotations

from ..errors import TunelabError


def parse_range(text: str, what: str, unit: str, high: int, example: str) -> tuple[int, int]:
    """'1-8' -> (1, 8); '5' -> (5, 5); both ends within 1..`high`, counted in `unit`s (for the messages)."""
    lo_text, sep, hi_text = text.partition("-")
    try:
        lo = int(lo_text)
        hi = int(hi_text) if sep else lo
    except ValueError:
        raise TunelabError(f"{what} {text!r}: expected a {unit} count or a range like {example}") from None
    if lo < 1 or hi < lo or hi > high:
        raise TunelabError(f"{what} {text!r}: need 1 <= low <= high <= {high:,} {unit}s, e.g. {example}")
    return lo, hi
