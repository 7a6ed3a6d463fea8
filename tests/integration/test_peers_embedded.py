"""Peers on the embedded SmolLM2-135M: each recipe trains, and its record carries real measurements."""

from __future__ import annotations

import functools
import importlib.util

import pytest
from conftest import write_jsonl

from tunelab.bench import peers
from tunelab.bench.points import in_fresh_process
from tunelab.config import BatchConfig, DataConfig, LoraConfig

pytestmark = pytest.mark.integration


# The Trainer peers run on the tiny model (tests/unit/bench/test_peers.py: hf-trainer-seed's fixed recipe, 8 fp32
# micro-batches of 2 x 512 a step, took a minute here) and hf-trainer-tuned in a fresh process in
# tests/unit/bench/test_suite.py's suite; TRL's SFTTrainer, padding-free, runs here on the real model.
@pytest.mark.parametrize("name", ["trl-sft"])
def test_peer_on_embedded_model(name, tmp_path, addition_rows):
    if name == "trl-sft" and importlib.util.find_spec("trl") is None:
        pytest.skip("trl is not installed")
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    # In a fresh process, as bench runs peers: peak memory on CPU is RSS growth over the run, and in this
    # long-lived test process pages freed by earlier tests can hold a small run entirely (measured: 0 bytes).
    rec = in_fresh_process(
        functools.partial(
            peers.run_peer,
            name,
            "embedded",
            DataConfig(path=str(data), template="compact"),
            steps=2,  # one warm-up step, one measured
            warmup=1,
            batch=BatchConfig(seq_len=64, micro_batch=2),
            lora=LoraConfig(r=8, alpha=16.0, targets="attn"),
            device="cpu",
        )
    )
    assert rec["kind"] == name and rec["steady_window_steps"] == 1
    assert rec["tokens_padded_per_s"] >= rec["tokens_nonpad_per_s"] > rec["tokens_loss_per_s"] > 0
    assert rec["peak_memory_bytes"] > 100 * 2**20  # the 135M-parameter model is in there
    if name == "trl-sft":
        assert rec["steady_tokens_padded"] == rec["steady_tokens_nonpad"]  # padding-free
