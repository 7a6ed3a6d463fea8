"""configs/qwen2.5-0.5b-axolotl.yaml end to end through the command line, on a tiny random-init Qwen2 built here
(the hub model is not downloadable in CI): ShareGPT data, the ChatML default of a tokenizer without a chat
template, evaluation on the 5% split, TensorBoard, and best/ with summary.json at the end."""

from __future__ import annotations

import json
import random

import pytest
import torch
from conftest import REPO, make_tokenizer, write_jsonl

from tunelab.cli import main
from tunelab.config import load_config
from tunelab.data.formats import CHATML_TEMPLATE

RECIPE = REPO / "configs" / "qwen2.5-0.5b-axolotl.yaml"


def test_the_recipe_is_the_axolotl_shape():
    cfg = load_config(RECIPE)
    assert (cfg.model, cfg.adapter.method, cfg.data.format, cfg.run.report_to) == (
        "Qwen/Qwen2.5-0.5B-Instruct",
        "lora",
        "sharegpt",
        "tensorboard",
    )
    assert cfg.eval.split == 0.05 and cfg.eval.steps and cfg.eval.early_stopping_patience and cfg.batch.packing


@pytest.fixture(scope="module")
def tiny_qwen_dir(tmp_path_factory):
    """A Qwen2 of Qwen2.5-0.5B's build (tied embeddings, q/k/v biases, grouped KV heads) at toy sizes, saved with a
    tokenizer that has no chat template, as a base model's often has none."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = make_tokenizer()
    tokenizer.chat_template = None
    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        use_sliding_window=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    path = tmp_path_factory.mktemp("tiny-qwen2")
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def sharegpt_rows(n: int) -> list[dict]:
    r = random.Random(0)
    rows = []
    for i in range(n):
        a, b = r.randint(0, 99), r.randint(0, 99)
        turns = [{"from": "system", "value": "Add."}] if i % 2 else []
        turns += [{"from": "human", "value": f"{a} + {b}"}, {"from": "gpt", "value": str(a + b)}]
        rows.append({"conversations": turns})
    return rows


@pytest.mark.slow
def test_the_recipe_trains_evaluates_and_logs_end_to_end(tiny_qwen_dir, tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = write_jsonl(tmp_path / "chat.jsonl", sharegpt_rows(60))
    out = tmp_path / "run"
    # The recipe as shipped, but for the model, the data, where it writes, and a run a CPU does in seconds.
    overrides = [
        f"model={tiny_qwen_dir}",
        f"data.path={data}",
        f"output_dir={out}",
        "max_steps=4",
        "eval.steps=2",
        "seq_len=128",
        "micro_batch=2",
        "grad_accum=1",
        "log_steps=1",
    ]
    assert main(["train", "--config", str(RECIPE), *overrides]) == 0
    printed = capsys.readouterr().out
    assert f"model {tiny_qwen_dir} has no chat template; using ChatML" in printed

    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] and summary["steps"] == 4
    assert summary["eval_examples"] == 3  # 5% of 60 rows
    assert summary["evaluations"] == 2

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [(m["step"], m["eval_loss"]) for m in records if "eval_loss" in m]
    assert [s for s, _ in evals] == [2, 4]
    best_step, best_loss = min(evals, key=lambda e: e[1])
    assert (summary["best_step"], summary["best_eval_loss"]) == (best_step, best_loss)
    kept = json.loads((out / "best" / "tunelab_best.json").read_text())
    assert (kept["step"], kept["eval_loss"]) == (best_step, best_loss)
    assert (out / "best" / "adapter_config.json").is_file() and (out / "adapter" / "adapter_config.json").is_file()

    # The tokenizer saved beside the weights carries the template training rendered with.
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out / "adapter").chat_template == CHATML_TEMPLATE

    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    logged = [(e.step, e.value) for e in acc.Scalars("eval_loss")]
    assert [s for s, _ in logged] == [2, 4]
    assert [v for _, v in logged] == pytest.approx([v for _, v in evals], rel=1e-6)
    assert [e.step for e in acc.Scalars("loss")] == [1, 2, 3, 4]
