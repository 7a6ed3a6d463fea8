"""The suites of `tunelab bench suite` as data: bench/suites.yaml (or a file of the same form) read and checked
into a Suite of Rows, each error one line naming the suite, row and key."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..errors import TunelabError
from ..io import read_text
from ..modelref import RANDOM

AUTO = "auto"
DEFAULT_CAP = 8
ROW_KEYS = {
    "name",
    "model",
    "method",
    "compile",
    "grad_ckpt",
    "micro_batch",
    "micro_batch_cap",
    "steps",
    "warmup",
    "shape",
    "config",
    "skip_reason",
}
SUITE_KEYS = {"description", "budget_s", "data", "config", "micro_batch_cap", "peers", "rows"}
DATA_KEYS = {"rows", "prompt_tokens", "response_tokens", "dist", "seed"}


@dataclass(frozen=True)
class SuiteOptions:
    """What `tunelab bench suite` was asked: the suite, which of its rows (comma-separated names), the folder for
    its files, the config overrides for every row, and the catalog GPU whose peak applies."""

    suite: str
    rows: str | None = None
    out: str | None = None
    overrides: tuple[str, ...] = ()
    catalog_gpu: str | None = None


@dataclass(frozen=True)
class SuiteRow:
    name: str
    model: str
    method: str
    compile: bool
    grad_ckpt: bool
    micro_batch: int | str
    micro_batch_cap: int
    steps: int
    warmup: int
    shape: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    skip_reason: str | None = None


@dataclass(frozen=True)
class Suite:
    name: str
    source: str
    definition: dict  # as read, for the output file
    data: dict
    config: dict
    rows: list[SuiteRow]
    peers_after: str | None
    peer_names: list[str]
    budget_s: float | None


def builtin_suites() -> dict:
    return yaml.safe_load(resources.files("tunelab.bench").joinpath("suites.yaml").read_text())["suites"]


def load_suite(ref: str) -> Suite:
    """A suite of bench/suites.yaml by name, or the one suite in a YAML file of the same form."""
    if ref.endswith((".yaml", ".yml")):
        path = Path(ref)
        if not path.is_file():
            raise TunelabError(f"--suite {ref}: file not found")
        try:
            suites = (yaml.safe_load(read_text(path)) or {}).get("suites")
        except (yaml.YAMLError, AttributeError) as e:
            raise TunelabError(
                f"--suite {ref}: not a suites file ({str(e).splitlines()[0] if str(e) else 'no mapping'})"
            ) from None
        if not isinstance(suites, dict) or len(suites) != 1:
            raise TunelabError(f"--suite {ref}: expected `suites:` holding exactly one suite")
        ((name, raw),) = suites.items()
        return parse_suite(name, raw, ref)
    suites = builtin_suites()
    if ref not in suites:
        raise TunelabError(f"--suite {ref!r}: known suites are {', '.join(suites)} (or pass a .yaml file)")
    return parse_suite(ref, suites[ref], "tunelab/bench/suites.yaml")


def parse_suite(name: str, raw: Any, source: str) -> Suite:
    from ..data import synthetic as sy

    where = f"suite {name} ({source})"
    if not isinstance(raw, dict):
        raise TunelabError(f"{where}: expected a mapping")
    _known(where, raw, SUITE_KEYS)
    data = _mapping(where, "data", raw.get("data"))
    _known(f"{where}: data", data, DATA_KEYS)
    missing = DATA_KEYS - {"seed", "dist"} - set(data)
    if missing:
        raise TunelabError(f"{where}: data needs {', '.join(sorted(missing))}")
    # The workload is generated only once the run starts: its parameters are checked before anything runs.
    _int(where, "data.rows", data["rows"], 1)
    _int(where, "data.seed", data.get("seed", 0), 0)
    for key in ("prompt_tokens", "response_tokens"):
        sy.parse_range(str(data[key]), f"{where}: data.{key}")
    if data.get("dist", "triangular") not in sy.DISTS:
        raise TunelabError(f"{where}: data.dist must be one of {', '.join(sy.DISTS)}, got {data['dist']!r}")
    cap = _int(where, "micro_batch_cap", raw.get("micro_batch_cap", DEFAULT_CAP), 1)
    listed = raw.get("rows") or []
    if not isinstance(listed, list):
        raise TunelabError(f"{where}: rows must be a list of rows, got {listed!r}")
    rows = [parse_row(where, r, cap) for r in listed]
    if not rows:
        raise TunelabError(f"{where}: no rows")
    names = [r.name for r in rows]
    if len(set(names)) != len(names):
        raise TunelabError(f"{where}: row names must be unique")
    peers = _mapping(where, "peers", raw.get("peers"))
    after = peers.get("after")
    if peers and after not in names:
        raise TunelabError(f"{where}: peers.after must name a row, got {after!r}")
    peer_names = peers.get("names") or []
    if not isinstance(peer_names, list) or not all(isinstance(n, str) for n in peer_names):
        raise TunelabError(f"{where}: peers.names must be a list of peer names, got {peer_names!r}")
    budget = raw.get("budget_s")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0):
        raise TunelabError(f"{where}: budget_s must be a positive number of seconds, got {budget!r}")
    return Suite(
        name,
        source,
        raw,
        data,
        _mapping(where, "config", raw.get("config")),
        rows,
        after,
        list(peer_names),
        budget,
    )


def parse_row(where: str, raw: Any, cap: int) -> SuiteRow:
    if not isinstance(raw, dict) or "name" not in raw:
        raise TunelabError(f"{where}: every row is a mapping with a name")
    _known(f"{where}: row {raw['name']}", raw, ROW_KEYS)
    missing = {"model", "method", "steps"} - set(raw)
    if missing:
        raise TunelabError(f"{where}: row {raw['name']} needs {', '.join(sorted(missing))}")
    here = f"{where}: row {raw['name']}"
    mb = raw.get("micro_batch", AUTO)
    if mb != AUTO and not (isinstance(mb, int) and not isinstance(mb, bool) and mb >= 1):
        raise TunelabError(f"{here}: micro_batch must be a positive integer or auto, got {mb!r}")
    shape = _mapping(here, "shape", raw.get("shape"))
    if shape and not str(raw["model"]).startswith(RANDOM):
        raise TunelabError(f"{here}: shape overrides a random: model's catalog shape; drop it for {raw['model']}")
    return SuiteRow(
        str(raw["name"]),
        str(raw["model"]),
        str(raw["method"]),
        _bool(here, "compile", raw.get("compile", False)),
        _bool(here, "grad_ckpt", raw.get("grad_ckpt", False)),
        mb,
        _int(here, "micro_batch_cap", raw.get("micro_batch_cap", cap), 1),
        _int(here, "steps", raw["steps"], 1),
        _int(here, "warmup", raw.get("warmup", 2), 0),
        shape,
        _mapping(here, "config", raw.get("config")),
        raw.get("skip_reason"),
    )


def _mapping(where: str, key: str, value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TunelabError(f"{where}: {key} must be a mapping, got {value!r}")
    return dict(value)


def _int(where: str, key: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise TunelabError(f"{where}: {key} must be an integer of at least {least}, got {value!r}")
    return value


def _bool(where: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TunelabError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _known(where: str, raw: dict, keys: set[str]) -> None:
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise TunelabError(f"{where}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(keys))}")


def select_rows(suite: Suite, names: str | None) -> Suite:
    """`suite` with only the rows `names` (comma-separated) lists, in the suite's order; its peers stay only
    if the row they follow does."""
    if not names:
        return suite
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = [r.name for r in suite.rows]
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise TunelabError(
            f"--rows {names}: {', '.join(unknown) or 'no row named'}: suite {suite.name} has rows {', '.join(known)}"
        )
    rows = [r for r in suite.rows if r.name in wanted]
    keep_peers = suite.peers_after in wanted
    return replace(
        suite,
        rows=rows,
        peers_after=suite.peers_after if keep_peers else None,
        peer_names=suite.peer_names if keep_peers else [],
    )
