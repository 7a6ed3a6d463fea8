"""A DPO/ORPO run through the recipe: the step metrics TRL names are logged, a resumed run reproduces the losses,
and a precomputed reference table trains as the per-step reference forward does."""

from __future__ import annotations

import json
import random

import pytest
from conftest import tiny_train_config, write_jsonl

from tunelab.errors import TunelabError
from tunelab.recipes import finetune as recipe
from tunelab.train import loop

pytestmark = pytest.mark.slow  # trains


def pair_rows(n: int = 24) -> list[dict]:
    r = random.Random(0)
    rows = []
    for _ in range(n):
        a, b = r.randint(0, 99), r.randint(0, 99)
        rows.append({"prompt": f"{a} + {b}", "chosen": str(a + b), "rejected": str(a + b + 1)})
    return rows


def losses(out) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def run(model_dir, data, out, *extra, measure=None):
    cfg = tiny_train_config(model_dir, data, out, "seq_len=128", "micro_batch=2", *extra)
    return recipe.finetune(cfg, show_progress=False, measure=measure)


def test_dpo_logs_trl_metrics_and_resumes_exactly(tiny_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "pairs.jsonl", pair_rows())
    whole = run(tiny_model_dir, data, tmp_path / "whole", "objective=dpo", "max_steps=4")
    first = json.loads((tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()[0])
    assert abs(first["loss"] - 0.6931472) < 1e-5  # a fresh adapter: the policy is the reference, loss ln 2
    assert {"rewards/chosen", "rewards/margins", "rewards/accuracies", "logps/rejected"} <= first.keys()
    assert whole["finished"]
    run(
        tiny_model_dir,
        data,
        tmp_path / "cut",
        "objective=dpo",
        "max_steps=4",
        "save_steps=2",
        measure=loop.Measurement(stop_at=2),
    )
    run(tiny_model_dir, data, tmp_path / "cut", "objective=dpo", "max_steps=4", "save_steps=2", "resume=true")
    assert losses(tmp_path / "cut") == pytest.approx(losses(tmp_path / "whole"), rel=1e-6)
    pre = run(
        tiny_model_dir, data, tmp_path / "pre", "objective=dpo", "max_steps=4", "preference.precompute_reference=true"
    )
    assert losses(tmp_path / "pre") == pytest.approx(losses(tmp_path / "whole"), rel=1e-5)
    assert pre["finished"]


def test_orpo_run_logs_its_terms(tiny_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(8))
    run(tiny_model_dir, data, tmp_path / "o", "objective=orpo", "max_steps=2")
    first = json.loads((tmp_path / "o" / "metrics.jsonl").read_text().splitlines()[0])
    assert {"nll_loss", "log_odds_ratio", "log_odds_chosen", "rewards/chosen"} <= first.keys()
    assert first["loss"] == pytest.approx(first["nll_loss"] - 0.1 * first["log_odds_ratio"], rel=1e-5)


@pytest.mark.parametrize(
    "row, message",
    [
        ({"prompt": "1 + 1", "chosen": "2"}, r"pairs.jsonl:1: missing field 'rejected'"),
        ({"prompt": "1 + 1", "chosen": "", "rejected": "3"}, r"pairs.jsonl:1: field 'chosen' has an empty response"),
        ({"prompt": "1 + 1", "chosen": "2", "rejected": "2"}, r"pairs.jsonl:1: chosen and rejected are the same"),
    ],
)
def test_bad_pairs_are_one_line_errors(tiny_model_dir, tmp_path, row, message):
    data = write_jsonl(tmp_path / "pairs.jsonl", [row])
    with pytest.raises(TunelabError, match=message):
        run(tiny_model_dir, data, tmp_path / "bad", "objective=dpo")


def test_dpo_on_two_processes_equals_one(tiny_model_dir, tmp_path):
    """`--nproc 2` (gloo, accelerate launch) trains and logs what one process of twice the micro-batch does: the
    loss is normalised by the step's pairs over both ranks and the metrics are summed over them."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    data = write_jsonl(tmp_path / "pairs.jsonl", pair_rows())
    config = tmp_path / "dpo.yaml"
    config.write_text(
        f"model: {tiny_model_dir}\nobjective: dpo\ndata:\n  path: {data}\n  template: compact\nseq_len: 128\n"
        "max_steps: 3\nprecision: fp32\nlog_steps: 1\nlr: 1.0e-2\ngrad_accum: 2\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "tunelab.cli", "train", "--config", str(config), "--nproc", "2", "--quiet"]
        + ["micro_batch=1", f"output_dir={tmp_path / 'two'}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    from tunelab.config import load_config

    recipe.finetune(load_config(config, ["micro_batch=2", f"output_dir={tmp_path / 'one'}"]), show_progress=False)
    lines = {
        name: [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        for name in ("one", "two")
    }
    for a, b in zip(lines["one"], lines["two"], strict=True):
        for key in ("loss", "rewards/margins", "rewards/accuracies", "logps/chosen"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (a["step"], key)
