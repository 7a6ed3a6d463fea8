"""`tunelab train --from FILE`: another tool's config (Axolotl's keys) trains the same job with tunelab on the
embedded model, after plan's prediction of both runs side by side and every key plan did not model."""

from __future__ import annotations

import json

import yaml

from tunelab.cli import main


def test_train_from_an_axolotl_config_predicts_both_then_trains_its_job(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open("rows.jsonl", "w") as f:
        for i in range(16):
            f.write(json.dumps({"instruction": f"Add {i} and {i + 1}.", "input": "", "output": str(2 * i + 1)}) + "\n")
    config = {
        "base_model": "embedded",
        "adapter": "lora",
        "lora_r": 8,
        "lora_alpha": 16,
        "lora_target_modules": ["q_proj", "v_proj"],
        "datasets": [{"path": "rows.jsonl", "type": "alpaca"}],
        "sequence_len": 128,
        "sample_packing": True,
        "micro_batch_size": 2,
        "max_steps": 1,
        "optimizer": "adamw_torch",
        "output_dir": "out",
        "wandb_project": "mine",
    }
    (tmp_path / "ax.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", "--from", "ax.yaml", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "an Axolotl config (stack hf-peft):" in out and "tunelab, the same job:" in out
    assert "not modeled: wandb_project: no effect on time or memory" in out
    assert json.loads(out.strip().splitlines()[-1])["steps"] == 1
    ran = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())  # the job Axolotl's keys describe
    assert (ran["lora"]["r"], ran["lora"]["targets"], ran["seq_len"], ran["micro_batch"]) == (
        8,
        ["q_proj", "v_proj"],
        128,
        2,
    )
