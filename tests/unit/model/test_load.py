"""load_model's meta build: what FSDP processes other than the main one construct before receiving their shards."""

from __future__ import annotations

import pytest
import torch

from tunelab.config import AdapterConfig, LoraConfig
from tunelab.model.adapters import apply_adapter
from tunelab.model.load import load_model
from tunelab.sources import resolve


@pytest.mark.parametrize("method", ["lora", "dora", "full"])
def test_a_meta_build_has_the_loaded_models_weights_without_their_values(tiny_model_dir, method):
    source = resolve(str(tiny_model_dir))
    spec = AdapterConfig(method=method, lora=LoraConfig(r=4, alpha=8.0))
    real = apply_adapter(load_model(source, torch.bfloat16, "none", torch.device("cpu")), spec)
    empty = apply_adapter(load_model(source, torch.bfloat16, "none", torch.device("cpu"), meta=True), spec)

    assert all(t.is_meta for t in empty.state_dict().values())
    assert all(b.is_meta for b in empty.buffers())
    # Every weight the main process will send has a place of the same shape and dtype, trainable alike.
    shapes = {k: (v.shape, v.dtype) for k, v in real.state_dict().items()}
    assert {k: (v.shape, v.dtype) for k, v in empty.state_dict().items()} == shapes
    trainable = {n for n, p in real.named_parameters() if p.requires_grad}
    assert {n for n, p in empty.named_parameters() if p.requires_grad} == trainable
    assert {n for n, _ in empty.named_buffers()} == {n for n, _ in real.named_buffers()}


@pytest.mark.parametrize(
    "change, first",
    [
        ({"num_hidden_layers": "+1"}, "model.layers.2."),  # the tiny model has 2 layers: a third from nowhere
        ({"model_type": "mamba", "architectures": ["MambaForCausalLM"]}, "backbone."),  # modules the weights lack
    ],
    ids=["more-layers", "other-family"],
)
def test_weights_that_miss_tensors_of_the_config_are_one_line_and_nothing_trains(
    tiny_model_dir, tmp_path, capsys, change, first
):
    """transformers would start the missing tensors random (its warning is silenced); train refuses instead."""
    import json
    import shutil

    from conftest import small_run_config

    from tunelab.cli import main

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 2
    for key, value in change.items():
        config[key] = config[key] + 1 if value == "+1" else value
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "run"
    cfg = small_run_config(tmp_path, folder, f"output_dir: {out}\nmax_steps: 1\nmethod: full\n")
    assert main(["train", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the weights lack" in err[0] and f"(first: {first}" in err[0], err
    assert not out.exists()


def test_cpu_nf4_refuses_rows_bitsandbytes_dequantizes_wrongly(tmp_path, tokenizer):
    """QLoRA on the CPU over 4-bit rows of 96 inputs (a multiple of 16, not of 64), which bitsandbytes 0.50.2
    dequantizes to other weights: one line naming the width, before training (every QLoRA test loads rows of 64)."""
    from conftest import make_tiny_llama

    from tunelab.errors import TunelabError

    make_tiny_llama(len(tokenizer), hidden_size=96, head_dim=16, num_attention_heads=6).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(TunelabError, match="4-bit rows of 96 inputs wrongly on the CPU") as e:
        load_model(resolve(str(tmp_path)), torch.float32, "nf4", torch.device("cpu"))
    assert "\n" not in str(e.value)
