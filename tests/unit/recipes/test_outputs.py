"""recipes/outputs.py: the output directory's steps, taken once for every recipe (writable check, lock, stale temps,
logs as at a resumed checkpoint, config.yaml, summary.json under the disk-error handling, the time-limit line)."""

from __future__ import annotations

import ast
import errno
import json
import os
from pathlib import Path

import pytest

import tunelab
from tunelab.config import load_config
from tunelab.errors import TunelabError
from tunelab.recipes import outputs
from tunelab.train.lock import lock_output_dir

RECIPES = Path(tunelab.__file__).parent / "recipes"
TRAINING = ("finetune.py", "grpo.py")  # the recipes that train
# What only outputs.py may call or name: a recipe that took any of these steps itself would be a second copy.
OWN_STEPS = {
    "check_writable_dir",
    "lock_output_dir",
    "remove_stale_temps",
    "truncate_metrics",
    "disk_errors",
    "dump_yaml",
}
OWN_FILES = ("summary.json", "config.yaml", "metrics.jsonl")


def test_no_training_recipe_takes_an_output_directory_step_itself():
    offenders = []
    for path in (RECIPES / name for name in TRAINING):
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if name in OWN_STEPS:
                offenders.append(f"{path.name}:{node.lineno} {name}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value in OWN_FILES or node.value.startswith("time limit:"):
                    offenders.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert not offenders


def test_held_locks_and_removes_the_temps_a_killed_run_left(tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints" / ".tmp-step-4").mkdir(parents=True)
    (out / ".summary.json.tmp").write_text("{")
    with outputs.held(out):
        assert not (out / "checkpoints" / ".tmp-step-4").exists() and not (out / ".summary.json.tmp").exists()
        with pytest.raises(TunelabError, match="in use by"), lock_output_dir(out):
            pass
    with lock_output_dir(out):  # released on exit
        pass


def test_held_by_another_process_of_a_run_touches_nothing(tmp_path):
    out = tmp_path / "not-made"
    with outputs.held(out, main=False):
        assert not out.exists()


def test_held_refuses_an_unwritable_dir_with_one_line(tmp_path):
    if os.geteuid() == 0:
        blocked = Path("/proc/tunelab-out")  # root passes permission checks; /proc refuses anyway
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        blocked = tmp_path / "ro" / "out"
    with pytest.raises(TunelabError, match="cannot write there"), outputs.held(blocked):
        pytest.fail("entered")


def test_start_logs_keeps_a_resumed_runs_lines_up_to_its_checkpoint(tmp_path):
    cfg = load_config(None, [f"output_dir={tmp_path}"])
    for name in ("metrics.jsonl", "completions.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in (1, 2, 3)))
    (tmp_path / "metrics.jsonl").open("a").write('{"step": 4, "lo')  # cut short by a kill
    first = outputs.start_logs(cfg, tmp_path, tmp_path / "checkpoints" / "step-2", 2, False, ("completions.jsonl",))
    assert first == 0.1
    for name in ("metrics.jsonl", "completions.jsonl"):
        assert [json.loads(line)["step"] for line in (tmp_path / name).read_text().splitlines()] == [1, 2]
    assert load_config(tmp_path / "config.yaml").run.output_dir == str(tmp_path)


def test_start_logs_starts_fresh_logs_without_a_checkpoint(tmp_path, capsys):
    cfg = load_config(None, [f"output_dir={tmp_path}", "resume=true"])
    for name in ("metrics.jsonl", "completions.jsonl"):
        (tmp_path / name).write_text('{"step": 1}\n')
    assert outputs.start_logs(cfg, tmp_path, None, 0, True, ("completions.jsonl",)) is None
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "completions.jsonl").exists()
    assert "resume: no checkpoint in" in capsys.readouterr().out


def test_write_summary_turns_a_full_disk_into_one_line(tmp_path, monkeypatch):
    def full(path, chunks):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(outputs, "write_atomic", full)
    with pytest.raises(TunelabError, match=r"summary\.json: .* free space or choose another output_dir"):
        outputs.write_summary(tmp_path, {"steps": 1})


def test_the_time_limit_line(capsys):
    outputs.say_time_limited(4.5, 4, 8)
    assert capsys.readouterr().out == (
        "time limit: max_minutes 4.5 ended training after step 4 of 8; saved as a finished run\n"
    )
