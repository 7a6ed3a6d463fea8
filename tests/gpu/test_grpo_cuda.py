"""GRPO's CUDA path on a tiny random Llama: the KV-cache sampler gives the same greedy tokens on CUDA as on CPU
(fp32), and a two-step GRPO run in bf16 writes its metrics and adapter. Skipped without a CUDA device."""

import json

import pytest
import torch
from conftest import make_tiny_llama, tiny_train_config, write_jsonl

from tunelab.eval.sampling import sample
from tunelab.recipes.entry import train

pytestmark = pytest.mark.gpu


def test_greedy_sampling_on_cuda_equals_cpu():
    model = make_tiny_llama(64, seed=3).float()
    prompts = [[5, 6, 7, 8, 9], [11, 12], [17, 18, 19]]
    cpu = sample(model, prompts, 8, stop_ids=[63], pad_id=0, temperature=0)
    cuda = sample(model.cuda(), prompts, 8, stop_ids=[63], pad_id=0, temperature=0)
    assert cuda == cpu


def test_grpo_run_on_cuda(tmp_path, tiny_model_dir):
    rows = [{"instruction": f"{a} + {b}", "answer": str(a + b)} for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)]]
    data = write_jsonl(tmp_path / "prompts.jsonl", rows)
    out = tmp_path / "run"
    cfg = tiny_train_config(
        tiny_model_dir,
        data,
        out,
        "device=cuda",
        "precision=bf16",
        "objective=grpo",
        "micro_batch=2",
        "grad_accum=1",
        "grpo.num_generations=4",
        "grpo.max_completion_length=8",
        "grpo.beta=0.1",
        "max_steps=2",
        "grpo.rewards=[{name: exact_answer}]",
    )
    summary = train(cfg, show_progress=False)
    assert summary.steps == 2 and (out / "adapter").is_dir()
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert torch.isfinite(torch.tensor(record["loss"])) and "kl" in record
