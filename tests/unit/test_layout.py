"""The package layout (docs/design.md): `tunelab plan` stays torch-free, plan/ imports neither train/ nor model/ nor
sources.py, the command modules never import each other, and the unit tests mirror src/."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import tunelab

PACKAGE = Path(tunelab.__file__).parent
REPO = PACKAGE.parents[1]


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


def test_the_nproc_launcher_does_not_import_torch(tmp_path):
    """`tunelab train --nproc N` only checks, builds the launch command and waits (train/launch.py): each
    launched process imports the training stack itself."""
    code = (
        "import sys; from tunelab.train import launch; launch.run_launcher = lambda cmd: print('cmd', cmd[1:3]) or 0; "
        "from tunelab.cli import main; "
        f"rc = main(['train', '--config', 'configs/quickstart.yaml', '--nproc', '2', '--accelerate-config', "
        f"'configs/accelerate/fsdp2.yaml', 'output_dir={tmp_path / 'out'}', '--quiet']); "
        "print('rc', rc); print('torch loaded', 'torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
    assert "cmd ['-m', 'accelerate.commands.launch']" in out.stdout and "rc 0" in out.stdout, out.stderr
    assert "torch loaded False" in out.stdout


def test_plan_imports_neither_train_nor_model_nor_sources():
    """plan reads architectures and the data's lengths from its caller: the GRPO plan too (plan/grpo.py)."""
    offenders = {
        f"{p.name}: {m}"
        for p in modules_under("plan")
        for m in imported_modules(p)
        if unit_of(m) in ("train", "model", "sources")
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
    """The scan itself reads relative imports and those inside functions (calibration_dir's)."""
    found = imported_modules(PACKAGE / "plan" / "arch.py")
    assert "tunelab.plan.catalog" in found and "tunelab.errors" in found
    assert "tunelab.io" in imported_modules(
        PACKAGE / "plan" / "calibration.py"
    )  # calibration_dir's function-level import


def unit_of(module: str) -> str:
    """The package or top-level module of tunelab that `module` belongs to (tunelab.plan.arch -> plan)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def package_graph() -> dict[str, set[str]]:
    """Which of tunelab's packages and top-level modules import which, every import counted (also in functions)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        me = rel.parts[0].removesuffix(".py")
        for module in imported_modules(path):
            other = unit_of(module)
            # `from tunelab import x` names module x; the package root itself is no unit.
            if other and other != me and ((PACKAGE / other).is_dir() or (PACKAGE / f"{other}.py").is_file()):
                graph.setdefault(me, set()).add(other)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of units that import each other, directly or round a loop (strongly connected, size > 1)."""
    found, seen = [], set()
    for start in sorted(graph):
        if start in seen:
            continue
        reach = {start}
        frontier = [start]
        while frontier:
            for nxt in graph.get(frontier.pop(), ()):
                if nxt not in reach:
                    reach.add(nxt)
                    frontier.append(nxt)
        loop = sorted(u for u in reach if u == start or _reaches(graph, u, start))
        if len(loop) > 1:
            found.append(loop)
            seen.update(loop)
    return found


def _reaches(graph: dict[str, set[str]], a: str, b: str) -> bool:
    todo, done = [a], set()
    while todo:
        u = todo.pop()
        if u == b:
            return True
        if u not in done:
            done.add(u)
            todo.extend(graph.get(u, ()))
    return False


def module_name(path: Path) -> str:
    """The dotted name of the module at `path` (a package's __init__.py is the package)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph() -> dict[str, set[str]]:
    """Which of tunelab's modules import which, every import counted (also in functions). An import of a package
    the module sits in is no edge: importing a module imports its packages first, and `from . import x` names x."""
    paths = list(PACKAGE.rglob("*.py"))
    known = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        me = module_name(path)
        for module in imported_modules(path):
            if module in known and module != me and not me.startswith(module + "."):
                graph.setdefault(me, set()).add(module)
    return graph


def test_modules_import_each_other_in_one_direction_only():
    """No circle of modules importing each other (recipes.finetune <-> recipes.grpo), inside a package too, and
    imports inside functions count: a circle hidden in a function is still two modules that each need the other."""
    assert not cycles(module_graph())


def test_the_module_graph_sees_a_function_level_import_and_skips_the_own_package():
    graph = module_graph()
    assert "tunelab.io" in graph["tunelab.plan.calibration"]  # calibration_dir's function-level import
    assert "tunelab" not in graph.get("tunelab.api", set())  # `from . import config` in api.py


def test_packages_import_each_other_in_one_direction_only():
    """No import cycle between packages (sources <-> plan, bench <-> recipes, ...): each layer builds on those below."""
    assert not cycles(package_graph())


def test_the_cycle_check_finds_a_loop():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert not cycles({"a": {"b"}, "b": {"c"}})


def test_no_package_imports_another_packages_private_names():
    """A `_name` is its package's own: another package that needs it asks for a public name."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        me = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        package = ("tunelab." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)).rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package.split(".")
            module = (
                ".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
                if node.level
                else node.module or ""
            )
            if not module.startswith("tunelab") or unit_of(module) in ("", me):
                continue
            offenders += [
                f"{path.relative_to(PACKAGE)}:{node.lineno} {a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
    assert not offenders


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


def test_python_dash_m_tunelab_runs_the_cli():
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    out = subprocess.run(
        [sys.executable, "-m", "tunelab", "plan", "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: tunelab plan")
