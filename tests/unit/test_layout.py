"""The package layout (docs/design.md): `tunelab plan` stays torch-free, plan/ imports neither train/ nor model/,
the command modules never import each other, and the unit tests mirror src/."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import tunelab

PACKAGE = Path(tunelab.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every tunelab module `path` imports, at module level or inside a function, as an absolute name."""
    package = ("tunelab." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)).rsplit(".", 1)[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names)  # `from . import x` imports module x
    return {n for n in names if n == "tunelab" or n.startswith("tunelab.")}


def modules_under(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).glob("*.py")) if (PACKAGE / folder).is_dir() else []


def test_plan_for_a_catalog_gpu_does_not_import_torch():
    code = (
        "import sys; from tunelab.cli import main; "
        "rc = main(['plan', '--gpu', 'h100-sxm', '--model', 'meta-llama/Llama-3.1-8B', '--examples', '1000']); "
        "print('rc', rc); print('torch loaded', 'torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "rc 0" in out.stdout, out.stderr
    assert "torch loaded False" in out.stdout


def test_plan_imports_neither_train_nor_model():
    offenders = {
        f"{p.name}: {m}"
        for p in modules_under("plan")
        for m in imported_modules(p)
        if m.startswith(("tunelab.train", "tunelab.model"))
    }
    assert not offenders


def test_commands_never_import_each_other():
    offenders = {
        f"{p.name}: {m}"
        for p in modules_under("commands")
        for m in imported_modules(p)
        if m.startswith("tunelab.commands.") and m.split(".")[2] != p.stem
    }
    assert not offenders


def test_the_scan_sees_relative_and_function_level_imports():
    """The scan itself reads relative imports and those inside functions (resolve_arch's)."""
    probe = PACKAGE / "plan" / "arch.py"
    found = imported_modules(probe)
    assert "tunelab.plan.catalog" in found and "tunelab.errors" in found
    assert "tunelab.sources" in found  # resolve_arch's function-level import


def test_report_reads_records_without_the_training_stack():
    """`tunelab report` renders stored records: it needs neither torch nor the code that trains."""
    offenders = {
        f"{p.name}: {m}"
        for p in modules_under("report")
        for m in imported_modules(p)
        if m.startswith(("tunelab.train", "tunelab.model", "tunelab.recipes", "tunelab.bench.peers"))
    }
    assert not offenders
    code = "import sys, tunelab.report.sections; print('torch loaded', 'torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "torch loaded False" in out.stdout, out.stderr


def test_unit_tests_mirror_the_package():
    """tests/unit/<pkg>/test_<module>.py for tunelab.<pkg>; a folder with no package beside it is a misplaced test."""
    unit = Path(__file__).parent
    folders = {p.name for p in unit.iterdir() if p.is_dir() and p.name != "__pycache__"}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders <= packages, f"tests/unit folders with no tunelab package: {sorted(folders - packages)}"
    names = [p.name for p in unit.rglob("test_*.py")]
    assert len(names) == len(set(names)), "two test files share a name (pytest imports them by basename)"
