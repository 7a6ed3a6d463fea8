"""The CUDA paths of `train`, on a tiny random Llama: bf16 frozen weights, packed rows through SDPA (or
flash-attn's varlen kernels when installed), bitsandbytes nf4 for QLoRA, fused AdamW, LoRA dropout drawn
with torch.rand, compiled blocks, and memory read from the CUDA allocator. Skipped without a CUDA device
(tests/conftest.py); no GPU has been lent to this project yet, so these have not run. The same runs on CPU
are in tests/unit/train/test_loop.py."""

import importlib.util

import pytest
import torch

from conftest import tiny_train_config, write_jsonl
from tunelab.recipes.train import train, training_attention

pytestmark = pytest.mark.gpu


@pytest.fixture
def data_file(tmp_path, addition_rows):
    return write_jsonl(tmp_path / "add.jsonl", addition_rows)


def cuda_config(model_dir, data_file, out, *extra):
    return tiny_train_config(
        model_dir,
        data_file,
        out,
        "device=cuda",
        "log_steps=2",
        "precision=bf16",
        "packing=true",
        "max_steps=8",
        "lr=3e-2",
        *extra,
    )


@pytest.mark.parametrize(
    "extra",
    [
        ["method=lora"],
        ["method=qlora"],
        ["method=full", "lr=1e-3"],
        ["method=lora", "compile=true", "lora.dropout=0.1"],
    ],
    ids=["lora", "qlora", "full", "lora-dropout-compiled"],
)
def test_bf16_packed_training_on_cuda(tiny_model_dir, data_file, tmp_path, extra):
    summary = train(cuda_config(tiny_model_dir, data_file, tmp_path / "run", *extra), show_progress=False)
    assert summary["device"].lower() != "cpu" and summary["precision"] == "bf16"
    assert summary["loss_last"] < summary["loss_first"]
    # CUDA memory is the allocator's: max allocated, and max reserved beside it (docs/metrics.md).
    assert 0 < summary["peak_memory_bytes"] <= summary["peak_memory_reserved_bytes"]
    assert summary["peak_memory_reserved_bytes"] <= torch.cuda.get_device_properties(0).total_memory


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="flash-attn is not installed")
def test_flash_attn_varlen_takes_packed_rows(tiny_model_dir, data_file, tmp_path):
    assert training_attention(torch.device("cuda")) == "flash_attention_2"
    summary = train(cuda_config(tiny_model_dir, data_file, tmp_path / "run"), show_progress=False)
    assert summary["loss_last"] < summary["loss_first"]
