"""recipes/finetune.py: the compiled decoder blocks trace whole, for every method."""

from __future__ import annotations

import pytest
import torch
from conftest import compile_without_inductor, tiny_train_config, write_jsonl

from tunelab.recipes import finetune as recipe
from tunelab.train import loop
from tunelab.train.loss import CausalLMLoss

pytestmark = pytest.mark.slow  # traces the model with dynamo


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize(
    "extra",
    [
        ("method=qlora",),
        ("method=dora",),
        ("method=lora", "lora.dropout=0.1"),
        ("method=lora", "attention=flex"),
        ("method=lora", "grad_ckpt=true"),
    ],
    ids=["qlora", "dora", "lora-dropout", "lora-flex", "lora-grad-ckpt"],
)
def test_compiled_blocks_have_no_graph_break(tiny_model_dir, addition_rows, tmp_path, monkeypatch, extra, device):
    """A graph break inside a compiled block splits it into pieces that run eager glue between them, each piece
    a launch boundary on a GPU: forward and backward of one micro-batch break nowhere. Dynamo, not inductor,
    decides where graphs break, so the blocks compile with the aot_eager backend here (seconds instead of an
    inductor build). torch 2.11's dynamo broke the nf4 layer's graph on the truth value of its dequantizer.
    On CUDA (the gpu tier) attention is FlexAttention's unless the row says otherwise. Plain LoRA and full
    fine-tuning: the test below."""
    compile_without_inductor(monkeypatch)
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    _, graphs, breaks = _compiled_micro_batch(tiny_model_dir, data, tmp_path / "run", f"device={device}", *extra)
    assert graphs[0] > 0, "nothing was compiled"
    assert not breaks, breaks


def test_compiled_lora_blocks_run_one_graph_as_full_fine_tuning_does(
    tiny_model_dir, addition_rows, tmp_path, monkeypatch
):
    """Under LoRA the embedding is frozen, so without compile_blocks' hook the first block's input needs no grad
    while every other block's does, and dynamo compiles the first block a second graph (twice the compile time):
    a LoRA model compiles as many graphs as a fully fine-tuned one, in training and then under no_grad, its adapter
    still gets gradients in the first block, and neither breaks a graph (the test above, for these two methods)."""
    compile_without_inductor(monkeypatch)
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    graphs = {}
    for method in ("full", "lora"):
        model, graphs[method], breaks = _compiled_micro_batch(
            tiny_model_dir, data, tmp_path / method, f"method={method}"
        )
        assert not breaks, (method, breaks)
    # B starts at zero, so B's gradient is the one that is nonzero at the first step
    first = [p for n, p in model.named_parameters() if "layers.0." in n and "lora_B" in n]
    assert first and all(p.grad is not None and p.grad.abs().sum() > 0 for p in first)
    assert graphs["lora"] == graphs["full"] and graphs["full"][0] > 0, graphs


def _compiled_micro_batch(model_dir, data, out, *extra):
    """The tiny model with compiled blocks (bf16) after one training micro-batch's forward and backward and one
    forward under no_grad: (the model, (graphs dynamo built for training, graphs added under no_grad), graph
    breaks)."""
    from torch._dynamo.utils import counters

    cfg = tiny_train_config(model_dir, data, out, "compile=true", "precision=bf16", *extra)
    prep = recipe.prepare_run(cfg)
    torch._dynamo.reset()
    counters.clear()
    try:
        model = CausalLMLoss(recipe.build_model(cfg, prep))
        model.train()
        batch = prep.schedule.step_batches(0)[0]
        with torch.autocast(prep.device.type, torch.bfloat16):
            loop.forward(model, batch, prep.device).backward()
            trained = counters["stats"]["unique_graphs"]
            with torch.no_grad():
                loop.forward(model, batch, prep.device)
        return model, (trained, counters["stats"]["unique_graphs"] - trained), dict(counters["graph_break"])
    finally:
        torch._dynamo.reset()


def _oom_argv(tiny_model_dir, data, out, *extra) -> list[str]:
    from tunelab.config import dump_yaml

    config = out.parent / f"{out.name}.yaml"
    config.write_text(dump_yaml(tiny_train_config(tiny_model_dir, data, out, *extra)))
    return ["train", "--config", str(config), "--quiet"]


def test_out_of_memory_in_a_step_is_one_line_with_the_levers_and_the_checkpoint_kept(
    tiny_model_dir, addition_rows, tmp_path, monkeypatch, capsys
):
    """As a GPU fails a micro-batch too large for it: step 3 of a run that saved at step 2."""
    from tunelab.cli import main

    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    calls, real_forward = [], loop.forward

    def forward(model, batch, device):
        calls.append(1)
        if len(calls) == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_forward(model, batch, device)

    monkeypatch.setattr(loop, "forward", forward)
    out = tmp_path / "out"
    rc = main(_oom_argv(tiny_model_dir, data, out, "max_steps=4", "save_steps=2", "grad_accum=1"))
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "tunelab train: error: out of memory on " in err
    for part in ("in step 3,", "method lora, micro_batch", "lower micro_batch", "grad_ckpt=true", "method=qlora"):
        assert part in err, err
    assert (
        f"{out / 'checkpoints' / 'step-0000002'} is kept: resume=true continues from it, with a smaller micro_batch too"
        in err
    )
    assert not (out / "adapter").exists() and not (out / "summary.json").exists()


def test_out_of_memory_while_loading_names_it_and_other_errors_keep_their_traceback(
    tiny_model_dir, addition_rows, tmp_path, monkeypatch, capsys
):
    from tunelab.cli import main
    from tunelab.model import load as mload

    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    refusal = "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried to allocate 9"

    def load_model(*args, **kwargs):
        raise RuntimeError(refusal)

    monkeypatch.setattr(mload, "load_model", load_model)
    assert main(_oom_argv(tiny_model_dir, data, tmp_path / "a", "grad_ckpt=true", "method=full")) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "out of memory on" in line and "before the first step (loading the model)" in line
    assert "grad_ckpt=true" not in line and "method=qlora" not in line and "is kept" not in line

    refusal = "a bug, not memory"
    with pytest.raises(RuntimeError, match="a bug, not memory"):
        main(_oom_argv(tiny_model_dir, data, tmp_path / "b"))
