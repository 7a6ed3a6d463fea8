"""Activation offloading (model/offload.py): the same gradients as without it, and the saved activations out
of the device's pool, on a tiny Llama on CPU through the copy path the CUDA path shares."""

import pytest
import torch

from tests.conftest import make_tiny_llama
from tunelab.config import AdapterConfig, LoraConfig
from tunelab.model import offload
from tunelab.model.adapters import apply_adapter


def _model(lora: bool, seed: int = 0):
    model = make_tiny_llama(96, seed=seed, hidden_size=128, intermediate_size=256)
    if lora:
        model = apply_adapter(model, AdapterConfig(lora=LoraConfig(r=8, alpha=16.0)))
        for name, p in model.named_parameters():  # B is zero at init: give the adapters a real path
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.05)
    model.train()
    return model


def _grads(model, ids, autocast: bool):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("grad_ckpt", [False, True])
@pytest.mark.parametrize("lora,autocast", [(True, False), (True, True), (False, False)])
def test_offloaded_activations_give_the_same_gradients(grad_ckpt, lora, autocast):
    ids = torch.randint(3, 96, (2, 160), generator=torch.Generator().manual_seed(1))
    ref_loss, ref = _grads(_model(lora), ids, autocast)
    model = _model(lora)
    offloader = offload.apply(model, True, grad_ckpt, copy_on_cpu=True)
    assert type(model.get_decoder().layers[0]).__name__.startswith("Offloaded")
    loss, got = _grads(model, ids, autocast)
    assert set(got) == set(ref) and got
    assert torch.equal(loss, ref_loss)
    for name in ref:
        assert torch.equal(got[name], ref[name]), name
    assert not offloader.groups  # every saved tensor came back once, and the bookkeeping is empty


def test_offload_moves_the_saved_activations():
    """During the forward the big saved tensors live in the offloader's host copies, counted per layer."""
    model = _model(lora=True)
    offloader = offload.apply(model, True, grad_ckpt=False, copy_on_cpu=True)
    ids = torch.randint(3, 96, (2, 160))
    loss = model(input_ids=ids, labels=ids).loss
    layers = len(model.get_decoder().layers)
    assert len(offloader.groups) == layers
    held = offloader.host_bytes()
    # each layer's MLP saves gate, SiLU and up outputs: 3 x 320 tokens x 256 x fp32 at least
    assert held >= layers * 3 * 320 * 256 * 4
    loss.backward()
    assert offloader.host_bytes() == 0


def test_offload_off_and_cpu_training_leave_the_model_alone():
    model = _model(lora=True)
    assert offload.apply(model, False, grad_ckpt=True) is None
    assert offload.apply(model, True, grad_ckpt=False) is None  # CPU: the tensors are in host memory already
    assert not type(model.get_decoder().layers[0]).__name__.startswith("Offloaded")


def test_layers_share_one_offloaded_class():
    """torch.compile guards on a layer's type: one subclass per layer recompiled per layer, past its limit."""
    model = make_tiny_llama(64, num_hidden_layers=3)
    offload.apply(model, True, grad_ckpt=True, copy_on_cpu=True)
    kinds = {type(layer) for layer in model.get_decoder().layers}
    assert len(kinds) == 1 and next(iter(kinds)).__name__.startswith("Offloaded")
