"""recipes/train.py: the compiled decoder blocks trace whole, for every method."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_train_config, write_jsonl
from tunelab.recipes import train as recipe
from tunelab.train import loop
from tunelab.train.loss import CausalLMLoss

pytestmark = pytest.mark.slow  # traces the model with dynamo


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize(
    "extra",
    [
        ("method=lora",),
        ("method=qlora",),
        ("method=dora",),
        ("method=full",),
        ("method=lora", "lora.dropout=0.1"),
        ("method=lora", "attention=flex"),
        ("method=lora", "grad_ckpt=true"),
    ],
    ids=["lora", "qlora", "dora", "full", "lora-dropout", "lora-flex", "lora-grad-ckpt"],
)
def test_compiled_blocks_have_no_graph_break(tiny_model_dir, addition_rows, tmp_path, monkeypatch, extra, device):
    """A graph break inside a compiled block splits it into pieces that run eager glue between them, each piece
    a launch boundary on a GPU: forward and backward of one micro-batch break nowhere. Dynamo, not inductor,
    decides where graphs break, so the blocks compile with the aot_eager backend here (seconds instead of an
    inductor build). torch 2.11's dynamo broke the nf4 layer's graph on the truth value of its dequantizer.
    On CUDA (the gpu tier) attention is FlexAttention's unless the row says otherwise."""
    from torch._dynamo.utils import counters

    real_compile = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: real_compile(self, backend="aot_eager"))
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    cfg = tiny_train_config(
        tiny_model_dir, data, tmp_path / "run", "compile=true", "precision=bf16", f"device={device}", *extra
    )
    prep = recipe.prepare_run(cfg)
    torch._dynamo.reset()
    counters.clear()
    try:
        model = CausalLMLoss(recipe.build_model(cfg, prep))
        model.train()
        batch = prep.schedule.step_batches(0)[0]
        with torch.autocast(prep.device.type, torch.bfloat16):
            loss = loop.forward(model, batch, prep.device)
        loss.backward()
        breaks = dict(counters["graph_break"])
        graphs = counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert graphs > 0, "nothing was compiled"
    assert not breaks, breaks
