"""Each setting is declared once, in the config package's sections (config/sections.py, config/objective.py): no
other dataclass in src/tunelab re-declares two or more of them (a copy that must be kept in step, as plan's Settings
and MemorySetup once were). The few that do hold something else under those names, each said below."""

from __future__ import annotations

import ast

from conftest import REPO

from tunelab.config import leaf_keys

PACKAGE = REPO / "src" / "tunelab"
CONFIG = PACKAGE / "config"
# Names too generic to call a copy (a file's `path`, a process's `device`, a matrix's `r`).
GENERIC = {"path", "format", "template", "seed", "device", "steps", "name", "split", "weight", "mix", "model"}
GENERIC |= {"targets", "r", "alpha", "dropout", "reference", "beta", "objective", "attention"}
# Objects a run builds from a setting of that name: the torch optimizer, the loaded reward functions.
GENERIC |= {"optimizer", "rewards"}
# Dataclasses that hold setting names for another reason.
NOT_SETTINGS = {
    "recipes/summary.py:RunSummary": "a record of what ran (summary.json): resolved values, written, never read back",
    "recipes/finetune.py:Prepared": "the resolved precision (a torch dtype pair) and compile decision of a run",
    "plan/fit_rows.py:Row": "a measured row's conditions, read from benchmarks/plan-accuracy/rows",
    "bench/suite_schema.py:SuiteRow": "a suite row's overrides as suites.yaml writes them",
    "data/pipeline.py:DataSpec": "data/ sits below config (config names its templates); DataConfig.spec() builds it",
    "serve/engine.py:Job": "an HTTP request's own sampling fields (OpenAI's API), not a training setting",
}


def setting_names() -> set[str]:
    return {key.rsplit(".", 1)[-1] for key in leaf_keys()} - GENERIC


def dataclass_fields(path) -> dict[str, list[str]]:
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and any(_is_dataclass(d) for d in node.decorator_list):
            out[node.name] = [
                s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and hasattr(s.target, "id")
            ]
    return out


def _is_dataclass(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return getattr(target, "id", getattr(target, "attr", None)) == "dataclass"


def copies() -> dict[str, list[str]]:
    names = setting_names()
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if CONFIG in path.parents:
            continue
        for cls, fields in dataclass_fields(path).items():
            shared = [f for f in fields if f in names]
            where = f"{path.relative_to(PACKAGE)}:{cls}"
            if len(shared) >= 2 and where not in NOT_SETTINGS:
                found[where] = shared
    return found


def test_no_dataclass_outside_config_redeclares_settings():
    assert not copies()


def test_the_check_would_find_plans_old_settings_copy():
    names = setting_names()
    old = ["method", "base_quant", "compute_bytes", "seq_len", "micro_batch", "grad_accum", "packing", "grad_ckpt"]
    assert len([f for f in old if f in names]) == 7
    assert all(where.split(":")[0] and (PACKAGE / where.split(":")[0]).is_file() for where in NOT_SETTINGS)
