"""`tunelab data pairs` on the embedded SmolLM2-135M: a small run writes pairs of the model's own wrong answers,
which the DPO recipe loads and trains on."""

import json
import math

import pytest

from tunelab.cli import main
from tunelab.config import load_config
from tunelab.recipes import finetune as recipe

pytestmark = pytest.mark.integration


def test_onpolicy_pairs_load_and_train_under_dpo(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    args = ["data", "arithmetic", "--digits", "3-4", "--n", "8", "--templates", "plain", "--response", "aligned"]
    assert main([*args, "--out", str(rows)]) == 0
    pairs = tmp_path / "pairs.jsonl"
    sample = ["--model", "embedded", "--format", "alpaca", "--template", "compact", "--samples", "2"]
    assert main(["data", "pairs", "--data", str(rows), *sample, "--max-new-tokens", "24", "--out", str(pairs)]) == 0
    assert "from 8 prompts x 2 samples at temperature 1" in capsys.readouterr().out
    reference = {r["instruction"]: r for r in map(json.loads, rows.read_text().splitlines())}
    written = [json.loads(line) for line in pairs.read_text().splitlines()]
    assert written  # the base model has not learned addition
    for pair in written:
        row = reference[pair["prompt"]]
        assert pair["chosen"] == row["output"] and pair["answer"] == row["answer"]
        assert pair["rejected"].strip() and pair["rejected"] != pair["chosen"]

    cfg = load_config(
        None,
        [
            "model=embedded",
            f"data.path={pairs}",
            "data.template=compact",
            "objective=dpo",
            "preference.precompute_reference=true",
            "lora.r=4",
            "seq_len=256",
            "micro_batch=2",
            "max_steps=1",
            "log_steps=1",
            "precision=fp32",
            "compile=false",
            f"output_dir={tmp_path / 'dpo'}",
        ],
    )
    assert recipe.finetune(cfg, show_progress=False)["finished"]
    first = json.loads((tmp_path / "dpo" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-4)  # a fresh adapter: the policy is the reference
