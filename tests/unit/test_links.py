"""Every relative link in README.md, docs/ and benchmarks/ resolves: the file or folder exists, and a `#anchor`
into a markdown file names one of its headings (GitHub's slugs). No torch: it reads text."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[[^\]]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "benchmarks").rglob("*.md"))]


def slug(heading: str) -> str:
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m[1])
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    bad = []
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
            continue  # a URL: not this test's
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{path.relative_to(REPO)}: {target}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{path.relative_to(REPO)}: {target} (no such heading)")
    return bad


def test_every_relative_link_in_readme_docs_and_benchmarks_resolves():
    files = markdown_files()
    assert len(files) > 50
    bad = [b for f in files for b in broken_links(f)]
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Two words\n")
    doc = tmp_path / "b.md"
    doc.write_text(
        "[ok](a.md#two-words) [gone](c.md) [no](a.md#three) [url](https://x.y/z)\n```\n[in code](d.md)\n```\n"
    )
    global REPO
    saved, REPO = REPO, tmp_path
    try:
        assert broken_links(doc) == ["b.md: c.md", "b.md: a.md#three (no such heading)"]
    finally:
        REPO = saved
