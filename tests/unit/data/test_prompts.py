"""data/prompts.py and `tunelab data arithmetic --prompts`: prompt rows rendered as training renders them, their
fields kept, prompts too long for a completion counted and dropped; config refuses what grpo does not support."""

from __future__ import annotations

import json

import pytest
from conftest import write_jsonl

from tunelab.config import load_config
from tunelab.data.pipeline import DataSpec
from tunelab.data.prompts import prepare_prompts
from tunelab.errors import TunelabError


def spec(path, seq_len=64, reserve=16, fmt="alpaca"):
    return DataSpec(str(path), fmt, "compact", False, seq_len, reserve=reserve, builder="data.prompts:prepare_prompts")


def test_prompts_keep_fields_and_drop_long(tmp_path, tokenizer):
    rows = [{"instruction": "1 + 2", "answer": "3"}, {"instruction": "x" * 80, "answer": "0"}]
    data = prepare_prompts(spec(write_jsonl(tmp_path / "p.jsonl", rows)), tokenizer)
    assert len(data) == 1 and data.dropped == 1 and data.rows[0]["answer"] == "3"
    assert data.texts[0] == "### Instruction:\n1 + 2\n### Response:\n"
    assert tokenizer.decode(data.ids[0]) == data.texts[0]


def test_no_prompt_left_is_an_error(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "p.jsonl", [{"instruction": "x" * 80}])
    with pytest.raises(TunelabError, match="every prompt is longer than seq_len 64 minus the completion budget 16"):
        prepare_prompts(spec(path), tokenizer)


def test_missing_prompt_field_names_the_line(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "p.jsonl", [{"question": "1 + 2"}])
    with pytest.raises(TunelabError, match=r"p.jsonl:1: missing field 'instruction'"):
        prepare_prompts(spec(path), tokenizer)


def test_arithmetic_prompts_command(tmp_path):
    from tunelab.cli import main

    out = tmp_path / "p.jsonl"
    assert main(["data", "arithmetic", "--out", str(out), "--prompts", "--n", "5"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5 and all("output" not in r and r["answer"] and r["instruction"] for r in rows)
    assert all(r["digits"] == max(r["digits_a"], r["digits_b"]) for r in rows)  # what grpo.balance_by reads


@pytest.mark.parametrize(
    "override,message",
    [
        ("grpo.num_generations=1", "grpo.num_generations must be at least 2"),
        ("grpo.max_completion_length=64", "leaves no room for a prompt in seq_len 64"),
        ("data.format=text", "objective grpo reads prompts in format alpaca, completion, chat"),
        ("grpo.rewards=[]", "objective grpo needs grpo.rewards"),
        ("grpo.loss_type=ppo", "grpo.loss_type must be one of grpo, bnpo, dr_grpo, dapo"),
        ("grpo.balance_by=' '", "grpo.balance_by is empty"),
        ("grpo.decode=statc", "grpo.decode must be one of auto, dynamic, static, compiled; got 'statc' .*'static'"),
        ("eval.split=0.1", "objective grpo has no held-out loss"),
        (
            "grpo.schedule_within_limit=true",
            "grpo.schedule_within_limit fits the schedule to max_minutes, which is not",
        ),
    ],
)
def test_config_refuses_one_line(tmp_path, override, message):
    cfg = tmp_path / "g.yaml"
    cfg.write_text(
        "objective: grpo\ndata:\n  path: p.jsonl\nseq_len: 64\ngrpo:\n  max_completion_length: 16\n"
        "  rewards:\n    - name: exact_answer\n"
    )
    with pytest.raises(TunelabError, match=message) as e:
        load_config(cfg, [override])
    assert "\n" not in str(e.value)


def test_grpo_section_refused_for_sft(tmp_path):
    cfg = tmp_path / "s.yaml"
    cfg.write_text("data:\n  path: p.jsonl\ngrpo:\n  beta: 0.1\n")
    with pytest.raises(TunelabError, match="the grpo section applies to objective grpo"):
        load_config(cfg)
