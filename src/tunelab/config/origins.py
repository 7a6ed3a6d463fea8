"""Where each setting came from, and the one-line errors that name it: every check of a section, a rule or the
loader begins its error with the origin of the setting it is about (an override, the file, or `defaults`)."""

from __future__ import annotations

import difflib
from collections.abc import Collection

from ..errors import TunelabError


class Origins:
    """Where each setting came from, as the prefix of an error about it: the `key=value` override that set it
    (or a section holding it) last, else the config file, or `defaults` when there is none."""

    def __init__(self, file: str):
        self.file = file
        self.overrides: dict[str, str] = {}

    def set(self, key: str, item: str) -> None:
        """Record override `item` as the origin of `key` and of everything under it."""
        # An override replaces all that is under its key, so earlier overrides there set nothing that is left.
        self.overrides = {k: v for k, v in self.overrides.items() if key not in _ancestors(k)}
        self.overrides[key] = item

    def __call__(self, *keys: str) -> str:
        """The prefix for an error about `keys`: the override that set the first one an override set, else the file."""
        for key in keys:
            for k in _ancestors(key):
                if k in self.overrides:
                    return f"override {self.overrides[k]}"
        return self.file


def _ancestors(key: str) -> list[str]:
    """`data.mix[0].path` -> [`data.mix[0].path`, `data.mix[0]`, `data.mix`, `data`]: the key, then its sections."""
    parts = key.replace("[", ".[").split(".")
    return [".".join(parts[:n]).replace(".[", "[") for n in range(len(parts), 0, -1)]


def _check(where: Origins, key: str, ok: bool, why: str) -> None:
    """One range rule: `why` says what `key` must be; the error names where the key was set."""
    if not ok:
        raise TunelabError(f"{where(key)}: {key} {why}")


def _choice(source: Origins, key: str, value: str, choices: Collection[str]) -> None:
    """One choice: `value` must be one of `choices`; the error names the closest."""
    if value not in choices:
        close = difflib.get_close_matches(value, choices, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TunelabError(f"{source(key)}: {key} must be one of {', '.join(choices)}; got {value!r}{hint}")
