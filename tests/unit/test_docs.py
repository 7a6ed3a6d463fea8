"""docs/guide.md's config reference names every TrainConfig key, and only those; the plan commands the README and
the guide show run as shown."""

from __future__ import annotations

import re
import shlex

import pytest
from conftest import REPO

from tunelab.config import leaf_keys

GUIDE = REPO / "docs" / "guide.md"
SECTION = "## Config reference"
ROW_KEY = re.compile(r"^\|\s*`([^`]+)`\s*\|")


def config_keys() -> set[str]:
    """Dotted names of every leaf setting as a user writes it: `lora.r`, `data.path`, `seed`."""
    return leaf_keys()


def documented_keys(text: str) -> list[str]:
    """First-column keys of the table in the config reference section (up to the next `## ` heading)."""
    start = text.index(SECTION) + len(SECTION)
    end = text.find("\n## ", start)
    section = text[start:] if end == -1 else text[start:end]
    return [m.group(1) for line in section.splitlines() if (m := ROW_KEY.match(line))]


def test_config_keys_walks_nested_dataclasses():
    keys = config_keys()
    assert {"lora.r", "lora.targets", "data.path", "data.format", "seed", "model"} <= keys
    assert "lora" not in keys and "data" not in keys


def test_guide_documents_every_config_key_and_no_other():
    documented = documented_keys(GUIDE.read_text())
    keys = config_keys()
    missing = sorted(keys - set(documented))
    unknown = sorted(set(documented) - keys)
    repeated = sorted({k for k in documented if documented.count(k) > 1})
    assert not missing, f"docs/guide.md's config reference lacks: {', '.join(missing)}"
    assert not unknown, f"docs/guide.md's config reference names keys TrainConfig does not have: {', '.join(unknown)}"
    assert not repeated, f"docs/guide.md's config reference lists these keys twice: {', '.join(repeated)}"


# Commands that read a config's dataset need it on disk: the quickstart's comes from `make demo`.
NEEDS_A_RUN = "configs/quickstart.yaml"


def plan_commands() -> list[str]:
    """Every `tunelab plan` line in a code block of the README and the guide (comments and `$ ` cut)."""
    lines = []
    for doc in (REPO / "README.md", GUIDE):
        for line in doc.read_text().splitlines():
            line = line.strip().removeprefix("$ ").split("  #")[0].strip()
            if line.startswith("tunelab plan ") and NEEDS_A_RUN not in line:
                lines.append(line)
    return lines


@pytest.mark.parametrize("command", plan_commands())
def test_the_plan_commands_the_docs_show_run(command, capsys, monkeypatch):
    from tunelab.cli import main

    monkeypatch.chdir(REPO)
    assert main(shlex.split(command)[1:]) == 0, capsys.readouterr().err
    assert "== " in capsys.readouterr().out
