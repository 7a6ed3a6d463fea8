"""benchmarks/gpu.sh, the one command of a GPU session: its steps exist, the suites it names exist with their
dry-run twins row for row, and every row is a valid training config, so the call cannot fail on a typo."""

import re
import subprocess
from pathlib import Path

import pytest

from tunelab.bench import suite as suitemod

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "benchmarks" / "gpu.sh"
STEP = re.compile(r"^\s*step (\S+) (\d+) (\d+) (.+)$", re.M)


def steps() -> list[tuple[str, int, int, str]]:
    return [(m[1], int(m[2]), int(m[3]), m[4]) for m in STEP.finditer(SCRIPT.read_text())]


def test_script_parses_and_every_step_is_a_function():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    names = [s[0] for s in steps()]
    # what the last call left unmeasured first, then the rows it measured
    assert names == [
        "ceilings",
        "data",
        "moe",
        "moe-suite",
        "optim-8b",
        "memory-parts",
        "long-8b",
        "speed-1b",
        "calibrated",
        "sharded",
        "tests",
        "profile",
        "speed-8b",
        "dpo",
        "decode",
        "grpo",
        "launch",
    ]
    for _, cap, need, command in steps():
        assert re.search(rf"^{re.escape(command.split()[0])}\(\) \{{", text, re.M), command
        assert need <= cap
    assert "BUDGET=540" in text  # ends within 9 minutes
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in ("gpu.log", "steps.md", "results.tgz"))
    # results.tgz comes back whole only under 16 MiB: weights, checkpoints and the workload stay out of it
    assert all(f"--exclude='{x}'" in text for x in ("*.safetensors", "checkpoints", "data.jsonl"))


SUITE_STEPS = [s[3].split() for s in steps() if s[3].startswith("suite ")]


def test_every_suite_row_runs_in_some_step():
    """The steps name rows by hand (their order is the call's priority): each name is a row, none is left out."""
    for name in {s[1] for s in SUITE_STEPS}:
        wanted = [r for s in SUITE_STEPS if s[1] == name for r in (s[2].split(",") if len(s) > 2 else [])]
        rows = [r.name for r in suitemod.load_suite(name).rows]
        assert not wanted or sorted(wanted) == sorted(set(wanted)) and set(wanted) <= set(rows), (name, wanted)
        if name == "h100-8b":
            assert set(wanted) == set(rows)


@pytest.mark.parametrize("name", sorted({s[1] for s in SUITE_STEPS}))
def test_suites_it_runs_exist_with_dry_twins_and_valid_rows(name, tmp_path):
    real, dry = suitemod.load_suite(name), suitemod.load_suite(f"{name}-dry")
    assert [r.name for r in real.rows] == [r.name for r in dry.rows]
    assert real.peers_after == dry.peers_after and real.peer_names == dry.peer_names
    for s in (real, dry):
        suitemod.check_configs(s, [], tmp_path)  # every row loads as a training config
        assert re.fullmatch(r"[A-Za-z0-9._-]+", s.name)  # the output files are named after the suite
    for row in real.rows:
        if row.config.get("activation_offload"):
            assert row.config["data.path"] == "build/gpu-long-docs.jsonl"
            assert "--out build/gpu-long-docs.jsonl" in SCRIPT.read_text()


def test_the_issue_rows_are_there():
    rows = {r.name: r for n in ("h100", "h100-8b") for r in suitemod.load_suite(n).rows}
    wanted = {"1b-lora", "1b-lora-compiled", "1b-full", "8b-lora-compiled", "8b-qlora-compiled"}
    assert wanted <= set(rows)
    assert rows["8b-lora-seq4096-compiled"].config["seq_len"] == 4096
    long = {n: r for n, r in rows.items() if r.config.get("activation_offload")}
    assert {(r.method, r.config["seq_len"]) for r in long.values()} == {("qlora", 131072), ("lora", 65536)}
    assert set(suitemod.load_suite("h100-8b").peer_names) == {"hf-trainer-tuned", "hf-trainer-liger"}
