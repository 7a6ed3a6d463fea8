"""load_model's meta build: what FSDP processes other than the main one construct before receiving their shards."""

from __future__ import annotations

import pytest
import torch

from tunelab.model.adapters import AdapterSpec, apply_adapter
from tunelab.model.load import load_model
from tunelab.sources import resolve


@pytest.mark.parametrize("method", ["lora", "dora", "full"])
def test_a_meta_build_has_the_loaded_models_weights_without_their_values(tiny_model_dir, method):
    source = resolve(str(tiny_model_dir))
    spec = AdapterSpec(method, r=4, alpha=8)
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
