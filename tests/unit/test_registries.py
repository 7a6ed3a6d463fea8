"""The registries (methods.py, objectives.py, optimizers.py) are the only code that knows method, objective and
optimizer names: everything else reads a row's behaviour (docs/design.md). A name compared, or a table keyed by
names, elsewhere is a second place that must learn of each new method, objective or optimizer, and forgets to."""

from __future__ import annotations

import ast
from pathlib import Path

import tunelab
from tunelab import methods, objectives, optimizers

PACKAGE = Path(tunelab.__file__).parent
REPO = PACKAGE.parents[1]
NAMES = frozenset(methods.NAMES) | frozenset(objectives.NAMES) | frozenset(optimizers.NAMES)
REGISTRIES = {PACKAGE / "methods.py", PACKAGE / "objectives.py", PACKAGE / "optimizers.py"}


def name_literals(node: ast.AST) -> list[str]:
    """The registry names `node` spells as string literals: itself, or the items of a tuple, list or set."""
    if isinstance(node, ast.Constant) and node.value in NAMES:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for item in node.elts for n in name_literals(item)]
    return []


def name_dispatch(source: str, where: str) -> list[str]:
    """Each place in `source` that compares a value with a registry name (`==`, `!=`, `in (...)`, `match`), or
    keys a table by two or more of them (one such key is a record's field, e.g. the config's `lora` section)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            names = [n for side in (node.left, *node.comparators) for n in name_literals(side)]
        elif isinstance(node, ast.MatchValue):
            names = name_literals(node.value)
        elif isinstance(node, ast.Dict):
            names = [n for key in node.keys if key is not None for n in name_literals(key)]
            names = names if len(names) > 1 else []
        else:
            continue
        if names:
            found.append(f"{where}:{node.lineno} {', '.join(repr(n) for n in names)}")
    return found


def scanned() -> list[Path]:
    files = [*PACKAGE.rglob("*.py"), *(REPO / "benchmarks" / "scripts").rglob("*.py")]
    return sorted(p for p in files if p not in REGISTRIES)


def dispatch_in(paths) -> list[str]:
    return [f for p in paths for f in name_dispatch(p.read_text(), str(p.relative_to(REPO)))]


def test_no_code_outside_the_registries_compares_method_or_objective_names():
    assert not dispatch_in(scanned())


def test_the_scan_finds_each_form_of_dispatch():
    source = """
if spec.objective == "orpo": pass
if method in ("lora", "dora"): pass
ok = "full" != method
table = {"lora": 1, "qlora": 2}
record = {"lora": {"r": 8}, "method": "lora"}
match objective:
    case "dpo": pass
if kind == "other": pass
"""
    assert [f.split(" ", 1)[1] for f in name_dispatch(source, "x.py")] == [
        "'orpo'",
        "'lora', 'dora'",
        "'full'",
        "'lora', 'qlora'",
        "'dpo'",
    ]


def test_every_pair_objective_names_a_pair_loss_the_loss_module_has():
    from tunelab.train.pair_loss import PAIR_LOSSES

    for row in objectives.REGISTRY.values():
        assert (row.pair_loss in PAIR_LOSSES) if row.pairs else not row.pair_loss, row.name
