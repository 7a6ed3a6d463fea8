"""The map stays true (issue 68): every repository path named in docs/*.md and in src/'s docstrings exists, and
every file docs/design.md's layout names is in the package it is listed under. No torch: it reads text."""

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "tunelab"
# A path is read relative to the repository, src/, the package, or plan/ (whose catalog/ docstrings name).
ROOTS = (REPO, REPO / "src", PACKAGE, PACKAGE / "plan")
# The first component that makes a token a repository path: the top folders and the package's subpackages.
FIRST = {"src", "tests", "benchmarks", "configs", "docs", "catalog", "tunelab"} | {
    p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_")
}
EXTENSIONS = {"py", "md", "yaml", "json", "jsonl", "sh", "txt", "toml", "png", "gz", "js", "css", "html"}
PATH = re.compile(r"(?<![\w./:-])((?:[\w.-]+/)+[\w.-]*[\w/])")
# A user's own data folder in guide.md's mixture example, not this repository's data/ package.
NOT_OURS = {"data/arithmetic.jsonl", "data/chats.jsonl"}


def named_paths(text: str) -> list[str]:
    """The repository paths a text names: `dir/file.ext`, `dir/`, and `package/module.attribute` (as the module's
    file). Patterns (`*`, `<name>`, `{a,b}`) and URLs are not paths."""
    out = []
    for m in PATH.finditer(text):
        path = m.group(1).rstrip(".")
        if path.split("/")[0] not in FIRST or re.search(r"[*<>{}]", text[m.start() : m.end() + 1]):
            continue
        last = path.rsplit("/", 1)[-1]
        if "." in last and last.rsplit(".", 1)[1] not in EXTENSIONS:
            path = path.rsplit("/", 1)[0] + "/" + last.split(".")[0] + ".py"  # a module's attribute
        elif "." not in last and not path.endswith("/"):
            continue  # `train/eval`, `a/b`: prose, not a path
        out.append(path)
    return out


def exists(path: str) -> bool:
    return path in NOT_OURS or any((root / path).exists() for root in ROOTS)


def docstrings(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield getattr(node, "lineno", 1), text


def test_every_path_docs_and_docstrings_name_exists():
    texts = [(f"{p.relative_to(REPO)}", p.read_text()) for p in sorted((REPO / "docs").glob("*.md"))]
    for path in sorted((REPO / "src").rglob("*.py")):
        texts += [(f"{path.relative_to(REPO)}:{line}", doc) for line, doc in docstrings(path)]
    missing = [f"{where}: {p}" for where, text in texts for p in named_paths(text) if not exists(p)]
    assert not missing, "\n".join(missing)


def layout_misses(design: str) -> list[str]:
    """Files the layout blocks name (`name.py`, bare) that are neither in the package of the section they are
    listed under (`recipes/   finetune.py (...)`) nor at the package's top level."""
    misses = []
    for block in re.findall(r"^```\n(.*?)^```", design, re.S | re.M):
        section = None
        for line in block.splitlines():
            if m := re.match(r"(\w+)/\s", line):
                section = m[1]
            elif re.match(r"\w+\.py\s", line):
                section = None
            for name in re.findall(r"(?<![\w/.`])(\w+\.py)\b(?!:)", line):
                if not (PACKAGE / name).exists() and not (section and (PACKAGE / section / name).exists()):
                    misses.append(f"{section or '.'}/{name}")
    return misses


def test_design_md_layout_names_files_that_exist():
    assert not layout_misses((REPO / "docs" / "design.md").read_text())


def test_the_checks_see_a_moved_file():
    assert named_paths("see recipes/train.py and plan/timing.steps_within, runs/x.json, src/*.py") == [
        "recipes/train.py",
        "plan/timing.py",
    ]
    assert not exists("recipes/train.py") and exists("plan/timing.py")
    assert layout_misses("```\nrecipes/        train.py (the recipe), methods.py\n```\n") == ["recipes/train.py"]
