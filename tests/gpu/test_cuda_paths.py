"""The CUDA paths of `train`, on a tiny random Llama: bf16 frozen weights, packed rows through SDPA (or
flash-attn's varlen kernels when installed), bitsandbytes nf4 for QLoRA, fused AdamW, LoRA dropout drawn
with torch.rand, compiled blocks, memory read from the CUDA allocator, and no host sync inside a step.
Skipped without a CUDA device (tests/conftest.py). The same runs on CPU are in tests/unit/train/."""

import importlib.util

import pytest
import torch
from conftest import tiny_train_config, write_jsonl

from tunelab.recipes.finetune import finetune, training_attention

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
    summary = finetune(cuda_config(tiny_model_dir, data_file, tmp_path / "run", *extra), show_progress=False)
    assert summary["device"].lower() != "cpu" and summary["precision"] == "bf16"
    assert summary["loss_last"] < summary["loss_first"]
    # CUDA memory is the allocator's: max allocated, and max reserved beside it (docs/metrics.md).
    assert 0 < summary["peak_memory_bytes"] <= summary["peak_memory_reserved_bytes"]
    assert summary["peak_memory_reserved_bytes"] <= torch.cuda.get_device_properties(0).total_memory


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="flash-attn is not installed")
def test_flash_attn_varlen_takes_packed_rows(tiny_model_dir, data_file, tmp_path):
    assert training_attention(torch.device("cuda")) == "flash_attention_2"
    summary = finetune(cuda_config(tiny_model_dir, data_file, tmp_path / "run"), show_progress=False)
    assert summary["loss_last"] < summary["loss_first"]


@pytest.mark.parametrize("extra", [["method=lora"], ["method=lora", "compile=true"]], ids=["eager", "compiled"])
def test_no_host_sync_between_log_steps_on_cuda(tiny_model_dir, data_file, tmp_path, monkeypatch, extra):
    """CUDA's own sync detector (torch.cuda.set_sync_debug_mode) raises on any synchronising call from the second
    step's first forward to the last micro-batch's, where the run's one log reads the loss; the loop's deliberate
    synchronize at the steady window's edge is let through. tests/unit/train/test_host_syncs.py counts the same
    on CPU."""
    from tunelab.train import loop

    steps, accum, seen = 6, 2, []
    forward, synchronize = loop.forward, loop.synchronize

    def watched(*args, **kwargs):
        seen.append(1)
        # From the second step: the first compiles, and inductor synchronizes while it tunes new kernels.
        watched_now = accum < len(seen) < steps * accum
        torch.cuda.set_sync_debug_mode("error" if watched_now else "default")
        return forward(*args, **kwargs)

    def deliberate(device):
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("default")
        synchronize(device)
        torch.cuda.set_sync_debug_mode(mode)

    monkeypatch.setattr(loop, "forward", watched)
    monkeypatch.setattr(loop, "synchronize", deliberate)
    cfg = cuda_config(
        tiny_model_dir,
        data_file,
        tmp_path / "run",
        f"max_steps={steps}",
        f"grad_accum={accum}",
        "log_steps=1000",
        *extra,
    )
    try:
        finetune(cfg, show_progress=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(seen) == steps * accum


def test_batches_reach_the_device_from_page_locked_memory(tiny_model_dir, data_file, tmp_path, monkeypatch):
    """The host-to-device copies of a micro-batch inside a step, as CUDA's own activity records name them:
    every one from pinned memory, none from pageable (device.to_device)."""
    from torch.profiler import ProfilerActivity, profile

    from tunelab.train import loop

    forward, copies, profiled_calls = loop.forward, [], []

    def profiled(*args, **kwargs):
        if profiled_calls or not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        profiled_calls.append(1)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = forward(*args, **kwargs)
            torch.cuda.synchronize()
        copies.extend(e.name for e in prof.events() if "HtoD" in e.name)
        return out

    monkeypatch.setattr(loop, "forward", profiled)
    finetune(cuda_config(tiny_model_dir, data_file, tmp_path / "run", "max_steps=2"), show_progress=False)
    # Kineto names them "Memcpy HtoD (Pinned -> Device)" or "(Pageable -> Device)".
    assert copies and not any("Pageable" in name for name in copies), copies
