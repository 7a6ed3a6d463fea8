"""Peer recipes: token counting on known batches, the recipes' tokenization, a measured tiny run, compare()."""

from __future__ import annotations

import dataclasses
import importlib.util
import math

import pytest
import torch
from conftest import write_jsonl

from tunelab.bench import peers
from tunelab.bench.compare import compare
from tunelab.config import BatchConfig, DataConfig, LoraConfig
from tunelab.data.formats import prompt_text
from tunelab.errors import TunelabError


def test_batch_tokens_counts_padding_mask_and_shifted_labels():
    input_ids = torch.tensor([[5, 6, 7, 8, 0, 0], [5, 6, 7, 8, 9, 10]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    # The first label of a row is never a target after the causal shift, even when it is not -100.
    labels = torch.tensor([[7, -100, 7, 8, -100, -100], [-100, -100, -100, 8, 9, 10]])
    padded, nonpad, loss = peers.batch_tokens(input_ids, attention_mask, labels)
    assert (padded, int(nonpad), int(loss)) == (12, 10, 5)


def test_batch_tokens_padding_free_row_is_all_real_tokens():
    input_ids = torch.arange(9).unsqueeze(0)  # TRL padding-free: sequences concatenated, no attention mask
    labels = torch.tensor([[-100, -100, 2, 3, -100, -100, 6, 7, 8]])
    padded, nonpad, loss = peers.batch_tokens(input_ids, None, labels)
    assert (padded, int(nonpad), int(loss)) == (9, 9, 5)


def test_token_meter_sums_training_forwards_only():
    meter = peers.TokenMeter()
    model = torch.nn.Linear(2, 2)
    handle = model.register_forward_pre_hook(meter.hook, with_kwargs=True)
    batch = dict(
        input_ids=torch.ones(2, 4, dtype=torch.long),
        attention_mask=torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]]),
        labels=torch.tensor([[-100, 1, -100, -100], [-100, 1, 1, -100]]),
    )

    def forward(input_ids, attention_mask, labels):
        return None

    model.forward = forward
    model.train()
    model(**batch)
    model(**batch)
    model.eval()
    model(**batch)  # evaluation forwards are not training throughput
    handle.remove()
    assert meter.totals() == (16, 10, 6)


def test_prompt_is_tunelabs_own_rendering():
    row = {"instruction": "12 + 30", "output": "42"}
    prompt, response = peers.prompt_and_response("alpaca", "alpaca", row, "</s>")
    assert prompt == prompt_text("alpaca", "alpaca", row)
    assert response == "42</s>"
    with pytest.raises(TunelabError, match="peers support"):
        peers.prompt_and_response("chat", "alpaca", {"messages": []}, "</s>")


def test_seed_tokenization_pads_to_max_length_and_masks_prompt_and_padding(tokenizer):
    prompt, response = peers.prompt_and_response(
        "alpaca", "compact", {"instruction": "1 + 2", "output": "3"}, tokenizer.eos_token
    )
    enc = peers.tokenize_masked(tokenizer, prompt, response, 64, pad_to_max=True)
    n_prompt = len(tokenizer(prompt)["input_ids"])
    n_full = len(tokenizer(prompt + response)["input_ids"])
    assert len(enc["input_ids"]) == len(enc["labels"]) == 64
    assert sum(enc["attention_mask"]) == n_full
    trained = [i for i, label in enumerate(enc["labels"]) if label != -100]
    assert trained == list(range(n_prompt, n_full))  # the response tokens ("3" and eos), nothing else
    assert [enc["input_ids"][i] for i in trained] == tokenizer(response, add_special_tokens=False)["input_ids"]
    dynamic = peers.tokenize_masked(tokenizer, prompt, response, 64, pad_to_max=False)
    assert len(dynamic["input_ids"]) == n_full


def test_setups_follow_the_recipes():
    cpu = torch.device("cpu")
    lora, batch = LoraConfig(r=16, alpha=32.0), BatchConfig(seq_len=256, micro_batch=8)
    seed = peers.setup_for("hf-trainer-seed", cpu, lora, batch)
    assert (seed.batch.seq_len, seed.batch.micro_batch, seed.batch.grad_accum, seed.lora) == (
        512,
        2,
        4,
        peers.SEED_LORA,
    )
    assert seed.precision.name == "fp32" and "fp16" in seed.precision_note  # CPU: no fp16 AMP, and it says so
    tuned = peers.setup_for("hf-trainer-tuned", cpu, lora, batch)
    assert (tuned.batch.seq_len, tuned.batch.micro_batch, tuned.lora, tuned.padding) == (256, 16, lora, "longest")
    with pytest.raises(TunelabError, match="unknown peer"):
        peers.setup_for("axolotl", cpu, lora, batch)


def test_trl_peer_without_trl_is_a_clear_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a))
    with pytest.raises(TunelabError, match="needs TRL"):
        peers.setup_for("trl-sft", torch.device("cpu"), LoraConfig(r=8, targets="attn"), BatchConfig(seq_len=256))


def test_liger_peer_is_the_tuned_recipe_with_liger_on_cuda_only(monkeypatch):
    lora, batch = LoraConfig(r=8, alpha=16.0, targets="attn"), BatchConfig(seq_len=256)
    with pytest.raises(TunelabError, match="needs a CUDA device"):
        peers.setup_for("hf-trainer-liger", torch.device("cpu"), lora, batch)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "liger_kernel" else real(name, *a)
    )
    with pytest.raises(TunelabError, match="pip install liger-kernel"):
        peers.setup_for("hf-trainer-liger", torch.device("cuda"), lora, batch)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "liger_kernel" else real(name, *a)
    )
    monkeypatch.setattr(peers, "pick_precision", lambda choice, device: peers.Precision("bf16"))
    liger = peers.setup_for("hf-trainer-liger", torch.device("cuda"), lora, batch)
    tuned = peers.setup_for("hf-trainer-tuned", torch.device("cuda"), lora, batch)
    assert liger.liger and not tuned.liger
    assert dataclasses.replace(liger, kind="hf-trainer-tuned", liger=False) == tuned


def test_tuned_peer_measures_exactly_the_tokens_it_trains_on(tmp_path, tiny_model_dir, tokenizer, addition_rows):
    """16 examples and micro-batch 16: every step is the whole dataset in one batch, so the window's token
    counts are known in advance from the tokenizer alone."""
    rows = addition_rows[:16]
    data = write_jsonl(tmp_path / "add.jsonl", rows)
    rec = peers.run_peer(
        "hf-trainer-tuned",
        str(tiny_model_dir),
        DataConfig(path=str(data), template="compact"),
        steps=4,
        warmup=2,
        lora=LoraConfig(r=4, alpha=8.0, targets="attn"),
        batch=BatchConfig(seq_len=128),
        device="cpu",
    )
    full, prompt = [], []
    for row in rows:
        p, r = peers.prompt_and_response("alpaca", "compact", row, tokenizer.eos_token)
        full.append(len(tokenizer(p + r)["input_ids"]))
        prompt.append(len(tokenizer(p)["input_ids"]))
    window = rec["steady_window_steps"]
    assert window == 2 and rec["steps"] == 4
    assert rec["steady_tokens_nonpad"] == window * sum(full)
    assert rec["steady_tokens_padded"] == window * 16 * max(full)
    assert rec["steady_tokens_loss"] == window * sum(f - p for f, p in zip(full, prompt))
    assert rec["tokens_nonpad_per_s"] == pytest.approx(rec["steady_tokens_nonpad"] / rec["steady_window_s"])
    assert rec["kind"] == "hf-trainer-tuned" and rec["micro_batch"] == 16
    # The tiny model can peak within memory the test process already holds: 0 above the baseline in a
    # fresh-clone `make test`. The process's absolute peak shows the reading was taken.
    assert rec["peak_memory_bytes"] >= 0 and rec["peak_memory_absolute_bytes"] > 0
    assert rec["versions"]["transformers"] and rec["device"]
    row = peers.store_record(rec)
    assert row["steps"] == 2 and row["transformers_version"] == rec["versions"]["transformers"]
    assert row["config"]["padding"] == "longest"


def test_seed_peer_pads_every_example_to_512_and_steps_over_four_micro_batches(tmp_path, tiny_model_dir, addition_rows):
    """The seed recipe keeps its own shape whatever tunelab's settings say: micro-batch 2 x 4 accumulated, every
    example padded to 512, fp32 on a CPU; one measured step is then exactly 2 x 4 x 512 fed tokens."""
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    tunelabs = BatchConfig(seq_len=128, micro_batch=4, grad_accum=2)  # what the recipe ignores
    rec = peers.run_peer(
        "hf-trainer-seed", str(tiny_model_dir), DataConfig(path=str(data)), 2, 1, device="cpu", batch=tunelabs
    )
    assert rec["kind"] == "hf-trainer-seed" and rec["steady_window_steps"] == 1
    assert (rec["micro_batch"], rec["seq_len"]) == (2, 512)
    assert rec["steady_tokens_padded"] == 2 * 4 * 512
    assert rec["tokens_padded_per_s"] > rec["tokens_nonpad_per_s"] > rec["tokens_loss_per_s"] > 0
    assert rec["precision"] == "fp32"


def test_peer_needs_a_window():
    with pytest.raises(TunelabError, match="no steady-state window"):
        peers.run_peer("hf-trainer-seed", "embedded", DataConfig(path="x.jsonl"), steps=2, warmup=2)


def _rec(kind, nonpad, padded, loss, mem):
    return {
        "kind": kind,
        "tokens_nonpad_per_s": nonpad,
        "tokens_padded_per_s": padded,
        "tokens_loss_per_s": loss,
        "peak_memory_bytes": mem,
    }


def test_compare_uses_the_mean_of_interleaved_tunelab_runs():
    records = [
        _rec("tunelab", 1000, 1100, 100, 200),
        _rec("hf-trainer-seed", 250, 1000, 20, 400),
        _rec("tunelab", 1200, 1300, 120, 220),
        _rec("hf-trainer-tuned", 550, 600, 50, 300),
        _rec("hf-trainer-seed", 300, 1000, 30, 400),
    ]
    seed, tuned = compare(records)
    assert seed["kind"] == "hf-trainer-seed" and tuned["kind"] == "hf-trainer-tuned"
    assert seed["tunelab_tokens_nonpad_per_s"] == 1100 and seed["tokens_nonpad_per_s"] == 275
    assert seed["tokens_nonpad_ratio"] == pytest.approx(4.0)
    assert seed["tokens_padded_ratio"] == pytest.approx(1.2)
    assert seed["tokens_loss_ratio"] == pytest.approx(110 / 25)
    assert seed["peak_memory_ratio"] == pytest.approx(210 / 400)
    assert tuned["tokens_nonpad_ratio"] == pytest.approx(2.0) and (tuned["runs"], tuned["tunelab_runs"]) == (1, 2)
    assert seed["tunelab_tokens_nonpad_per_s_runs"] == [1000, 1200]
    with pytest.raises(TunelabError, match="no tunelab run"):
        compare([_rec("hf-trainer-seed", 1, 1, 1, 1)])
    assert math.isnan(compare([_rec("tunelab", 1, 1, 1, 1), _rec("x", 0, 1, 1, 1)])[0]["tokens_nonpad_ratio"])
