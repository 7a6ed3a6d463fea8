"""The runs browser's reading side: status rules, metrics read while written, paths kept under --runs."""

import json
import os

import pytest

from tunelab.bench import store
from tunelab.errors import TunelabError
from tunelab.train.lock import lock_output_dir
from tunelab.ui import runs


def _run(root, name, metrics=(), summary=None, checkpoint=False):
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("model: embedded\n")
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    if checkpoint:
        (folder / "checkpoints" / "step-00000002").mkdir(parents=True)
    return folder


def test_status_rules(tmp_path):
    running = _run(tmp_path, "a")
    finished = _run(tmp_path, "b", summary={"finished": True})
    early = _run(tmp_path, "c", summary={"finished": False})
    resumable = _run(tmp_path, "d", checkpoint=True)
    crashed = _run(tmp_path, "e")
    with lock_output_dir(running):
        assert runs.status(running) == "running"
    assert runs.status(running) == "failed"  # no summary, no checkpoint once its process is gone
    assert runs.status(finished) == "finished"
    assert runs.status(early) == "stopped"
    assert runs.status(resumable) == "stopped"
    assert runs.status(crashed) == "failed"
    # An exit status this server saw wins over the guess from the files.
    assert runs.status(crashed, 130) == "stopped"
    assert runs.status(resumable, 1) == "failed"
    assert runs.run_names(tmp_path) == ["a", "b", "c", "d", "e"]


def test_detail_reads_curves_eta_and_prediction(tmp_path):
    lines = [
        {"step": 1, "total_steps": 4, "eta_s": 3.0, "loss": 2.5, "tokens_nonpad_per_s": 100.0, "peak_memory_bytes": 7},
        {"step": 2, "eval_loss": 2.4, "eval_tokens": 10, "eval_s": 0.1},
        {"step": 2, "total_steps": 4, "eta_s": 1.5, "loss": float("nan"), "tokens_nonpad_per_s": 120.0},
    ]
    folder = _run(tmp_path, "group/r", lines, summary={"finished": True, "train_s": 9.0, "peak_memory_bytes": 11})
    # The demo's eval.json: its own measured peak (from before any model loaded) wins over summary.json's.
    recorded = {"predicted": {"train_s": 8.0, "peak_memory_bytes": 12}, "train": {"peak_memory_bytes": 2 * 2**30}}
    (folder / "eval.json").write_text(json.dumps(recorded))
    with (folder / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "loss"')  # a line being written: not read yet
    d = runs.detail(tmp_path, "group/r")
    assert d["status"] == "finished" and d["step"] == 2 and d["total_steps"] == 4
    assert d["loss"] == [[1, 2.5], [2, None]]  # NaN is not JSON: shown as missing
    assert d["eval_loss"] == [[2, 2.4]]
    assert d["tokens_nonpad_per_s"] == 120.0 and d["eta_s"] is None  # no ETA once finished
    assert [(r["figure"], r["measured"], r["predicted"]) for r in d["comparison"]] == [
        ("train_s", 9.0, 8.0),
        ("peak_memory_bytes", 2 * 2**30, 12),
    ]
    assert [(r["label"], r["measured_text"]) for r in d["comparison"]] == [
        ("training time", "0.1 min"),
        ("peak memory", "2.00 GiB"),
    ]
    assert d["config"] == "model: embedded\n"
    # A run without eval.json: a `tunelab plan --json` line saved beside it as plan.json.
    (folder / "eval.json").unlink()
    (folder / "plan.json").write_text(json.dumps({"train_s": 7.0, "tokens_per_s": 50.0, "peak_memory_bytes": 13}))
    rows = runs.detail(tmp_path, "group/r")["comparison"]
    assert [(r["figure"], r["measured"], r["predicted"]) for r in rows] == [
        ("train_s", 9.0, 7.0),
        ("tokens_padded_per_s", None, 50.0),
        ("peak_memory_bytes", 11, 13),
    ]
    assert rows[1]["predicted_text"] == "50 tokens/s"  # a rate in its own unit, never minutes


def test_paths_stay_under_the_runs_folder(tmp_path):
    root = tmp_path / "runs"
    _run(root, "ok")
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "config.yaml").write_text("token: x\n")
    os.symlink(outside, root / "link")
    assert runs.inside(root, "ok/config.yaml") == (root / "ok" / "config.yaml").resolve()
    for bad in ("../secret/config.yaml", "/etc/passwd", "ok/../../secret", "link/config.yaml", "", "ok//x"):
        with pytest.raises(TunelabError):
            runs.inside(root, bad)
    assert runs.run_names(root) == ["ok"]  # the symlinked folder is not listed
    with pytest.raises(TunelabError):
        runs.detail(root, "link")


def test_bench_databases(tmp_path):
    db = tmp_path / "bench" / "bench.sqlite"
    store.insert(db, {"kind": "tunelab", "label": "micro_batch=4", "tokens_nonpad_per_s": 1234.5, "mfu": 0.25})
    assert runs.bench_databases(tmp_path) == ["bench/bench.sqlite"]
    (row,) = runs.bench_rows(tmp_path, "bench/bench.sqlite")
    assert row["label"] == "micro_batch=4" and row["tokens_nonpad_per_s"] == 1234.5 and row["mfu"] == 0.25
    with pytest.raises(TunelabError):
        runs.bench_rows(tmp_path, "bench/missing.sqlite")
