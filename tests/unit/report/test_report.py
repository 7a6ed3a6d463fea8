"""`tunelab report`: the files it writes and the numbers in them, from a fixture run dir and a fixture DB."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tunelab.cli import main
from tunelab.errors import TunelabError
from tunelab.report import sections as report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
VERSIONS = {"torch": "9.9.0", "transformers": "8.8.0", "peft": "7.7.0", "accelerate": "6.6.0"}


def make_run_dir(path: Path, micro_batch: int, nonpad: float, predicted: dict | None = None) -> Path:
    path.mkdir(parents=True)
    summary = {
        "model": "embedded",
        "method": "lora",
        "device": "Test CPU (2 threads)",
        "device_memory_bytes": 8 * 2**30,
        "precision": "bf16",
        "seq_len": 256,
        "micro_batch": micro_batch,
        "grad_accum": 1,
        "packing": True,
        "grad_ckpt": False,
        "steps": 6,
        "steady_window_steps": 4,
        "tokens_padded_per_s": nonpad * 1.25,
        "tokens_nonpad_per_s": nonpad,
        "tokens_loss_per_s": nonpad / 10,
        "step_time_s": 0.75,
        "peak_memory_bytes": 3 * 2**30,
        "peak_memory_reserved_bytes": None,
        "loss_first": 2.5,
        "loss_last": 1.25,
        "versions": VERSIONS,
    }
    (path / "summary.json").write_text(json.dumps(summary))
    lines = [
        {"step": s, "loss": 3.0 - s / 4, "tokens_nonpad_per_s": 100.0 * s, "tokens_padded_per_s": 125.0 * s}
        for s in range(1, 7)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    (path / "config.yaml").write_text(f"model: embedded\nlr: 0.0003\nmicro_batch: {micro_batch}\nlora:\n  r: 16\n")
    (path / "eval.json").write_text(json.dumps({"accuracy": 0.875}))
    if predicted:
        (path / "plan.json").write_text(json.dumps(predicted))
    return path


def make_db(path: Path, rows: list[dict]) -> Path:
    """The bench store's layout: flat columns, JSON text for `config`, 0/1 for booleans."""
    con = sqlite3.connect(path)
    con.execute(
        "CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT, label TEXT, device TEXT, "
        "torch_version TEXT, transformers_version TEXT, model TEXT, precision TEXT, micro_batch INTEGER, "
        "grad_accum INTEGER, seq_len INTEGER, packing BOOLEAN, tokens_padded_per_s REAL, "
        "tokens_nonpad_per_s REAL, tokens_loss_per_s REAL, step_time_s REAL, peak_memory_bytes INTEGER, "
        "predicted_step_time_s REAL, predicted_peak_memory_bytes INTEGER, config JSON)"
    )
    for r in rows:
        row = {
            "device": "Test CPU (2 threads)",
            "torch_version": "9.9.0",
            "transformers_version": "8.8.0",
            "model": "embedded",
            "precision": "bf16",
            "micro_batch": 8,
            "grad_accum": 1,
            "seq_len": 256,
            "packing": 1,
            "step_time_s": 1.0,
            **r,
        }
        if isinstance(row.get("config"), dict):
            row["config"] = json.dumps(row["config"])
        con.execute(f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
    con.commit()
    con.close()
    return path


def peer_row(kind: str, nonpad: float, mem: int, **extra) -> dict:
    return {
        "kind": kind,
        "tokens_nonpad_per_s": nonpad,
        "tokens_padded_per_s": nonpad * 2,
        "tokens_loss_per_s": nonpad / 5,
        "peak_memory_bytes": mem,
        **extra,
    }


@pytest.fixture
def inputs(tmp_path):
    plan = {
        "train_s": 50.0,
        "optimizer_steps": 100,
        "tokens_nonpad_per_s": 1500.0,
        "peak_memory_bytes": 2 * 2**30,
        "memory_breakdown": {"weights": 2**30, "activations": 2**30},
    }
    run_a = make_run_dir(tmp_path / "run-a", 4, 1000.0, predicted=plan)
    run_b = make_run_dir(tmp_path / "run-b", 8, 1600.0)
    db = make_db(
        tmp_path / "bench.sqlite",
        [
            peer_row("tunelab", 999.0, 2**30, micro_batch=2, label="sweep before the comparison"),  # not interleaved
            peer_row("tunelab", 2000.0, 2**30),
            peer_row("hf-trainer-seed", 500.0, 2**31, precision="fp32", config={"precision_note": "CPU: fp32"}),
            peer_row("tunelab", 2200.0, 2**30 + 2**29, predicted_step_time_s=0.5, predicted_peak_memory_bytes=2**30),
            peer_row("hf-trainer-tuned", 1050.0, 2**30),
        ],
    )
    return run_a, run_b, db


def test_report_writes_markdown_and_plots_with_the_inputs_numbers(tmp_path, inputs):
    out = tmp_path / "report"
    assert main(["report", *map(str, inputs), "--out", str(out)]) == 0
    md = (out / "performance.md").read_text()
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "loss.png",
        "peers_1.png",
        "performance.md",
        "predicted_vs_measured.png",
        "sweep_1_micro_batch.png",
        "sweep_2_micro_batch.png",
        "throughput.png",
    ]
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000
        assert f"({png.name})" in md  # every plot is referenced
    assert "Test CPU (2 threads), 8.00 GiB memory" in md
    assert "torch 9.9.0" in md and "transformers 8.8.0" in md
    # Run dirs: their summaries, configs and eval results.
    assert (
        "| run-a | tunelab | bf16 | 256 | 4 x 1 | yes | 6 (4) | 1,000 | 1,250 | 100 | 0.750 | 3.00 GiB | n/a | 2.500 -> 1.250 |"
        in md
    )
    assert "lr=0.0003" in md and "eval: {accuracy: 0.875}" in md
    # A bench record's steps are its measured window, after its warm-up steps: 2 + 3 run, 3 measured.
    from tunelab.report.sections import _steps

    assert _steps({"warmup_steps": 2, "steps": 3}) == "5 (3)"
    # Peer comparison: the tunelab rows interleaved with the peers (2000, 2200 -> mean 2100), not the 999 one.
    assert "| hf-trainer-seed | 1 / 2 | 500 | 2,100 | 4.20x | 4.20x | 4.20x | 0.62x |" in md
    assert "| hf-trainer-tuned | 1 / 2 | 1,050 | 2,100 | 2.00x |" in md
    assert "CPU: fp32" in md
    # Sweeps over micro_batch: the two run dirs, and the DB's tunelab rows (repeats of one value averaged).
    assert "| 4 | 1 | 1,000 | 3.00 GiB |" in md and "| 8 | 1 | 1,600 | 3.00 GiB |" in md
    assert "| 2 | 1 | 999 | 1.00 GiB |" in md and "| 8 | 2 | 2,100 | 1.25 GiB |" in md
    # Predicted vs measured: plan.json (50 s / 100 steps) and the DB's predicted_* columns.
    assert "| run-a | 0.500 | 0.750 | 1,500 | 1,000 | 2.00 GiB | 3.00 GiB | 1.50 |" in md
    assert "| tunelab #4 | 0.500 | 1.000 | n/a | 2,200 | 1.00 GiB | 1.50 GiB | 2.00 |" in md
    assert not list(out.glob(".tmp-*"))


def test_report_leaves_out_what_the_inputs_lack(tmp_path):
    run = make_run_dir(tmp_path / "only", 4, 1000.0)
    (run / "metrics.jsonl").unlink()
    out = tmp_path / "r"
    report.write_report(report.load_inputs([run]), out)
    md = (out / "performance.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["performance.md"]
    assert "vs peers" not in md and "Predicted" not in md and "Sweep" not in md


def test_peer_sessions_take_the_adjacent_tunelab_runs(tmp_path, inputs):
    _, _, db = inputs
    (session,) = report.peer_sessions(report.load_db(db))
    assert [r.record["id"] for r in session] == [2, 3, 4, 5]


def test_throughput_plot_skips_empty_log_windows(tmp_path):
    run = make_run_dir(tmp_path / "w", 4, 1000.0)
    lines = [
        {"step": 1, "loss": 2.0, "tokens_nonpad_per_s": 10.0, "tokens_padded_per_s": 12.0},
        {"step": 2, "loss": 1.9, "tokens_nonpad_per_s": 0.0, "tokens_padded_per_s": 0.0},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    (r,) = report.load_inputs([run])
    _, files = report._curve_section([r], tmp_path)
    assert set(files) == {"loss.png", "throughput.png"}


def test_preference_metrics_table(tmp_path):
    """A DPO run's metrics.jsonl names TRL's metrics; the report shows them at its first and last log line."""
    run = make_run_dir(tmp_path / "dpo", 4, 1000.0)
    lines = [
        {"step": s, "loss": 0.69 - s / 100, "rewards/margins": s / 10, "rewards/accuracies": s / 4} for s in (1, 2)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    out = tmp_path / "r"
    report.write_report(report.load_inputs([run]), out)
    md = (out / "performance.md").read_text()
    assert "## Preference metrics" in md
    assert "rewards/accuracies 0.5000, rewards/margins 0.2000" in md and "last (step 2)" in md
    sft = make_run_dir(tmp_path / "sft", 4, 1000.0)
    assert report._preference_section(report.load_inputs([sft]), tmp_path) == ([], {})


def test_bad_inputs_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    for bad, message in (
        (tmp_path / "empty", "no summary.json"),
        (tmp_path / "notes.txt", "neither a run directory"),
        (tmp_path / "missing", "not found"),
    ):
        assert main(["report", str(bad), "--out", str(tmp_path / "o")]) == 2
        assert message in capsys.readouterr().err
    with pytest.raises(TunelabError, match="table `runs`"):
        sqlite3.connect(tmp_path / "other.db").execute("CREATE TABLE t (x)").connection.commit()
        report.load_inputs([tmp_path / "other.db"])
