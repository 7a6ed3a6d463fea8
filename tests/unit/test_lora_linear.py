"""The fused LoRA linear (model/lora_linear.py): same maths as peft, and small updates survive bf16."""

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model

from tunelab.model.lora_linear import LoraLinear, pack_for_inference, use_fused_lora


class Block(torch.nn.Module):
    def __init__(self, width=64, out=48):
        super().__init__()
        self.proj = torch.nn.Linear(width, out, bias=True)

    def forward(self, x):
        return self.proj(x)


def peft_pair(dropout=0.0, b_scale=0.1, seed=0, nf4=False):
    """(peft's own layer, the fused copy) with identical, non-zero adapter weights; `nf4`: over an nf4 base."""
    torch.manual_seed(seed)
    block = Block()
    if nf4:
        block.proj = nf4_linear(block.proj)
    plain = get_peft_model(block, LoraConfig(r=8, lora_alpha=16, lora_dropout=dropout, target_modules=["proj"]))
    for name, p in plain.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=b_scale)
    fused = copy.deepcopy(plain)
    assert use_fused_lora(fused) == 1
    return plain, fused


def grads(model, x):
    x = x.clone().requires_grad_(True)
    y = model(x)
    (y * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
    named = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return y.detach(), x.grad, named


def test_fused_matches_peft_in_fp32():
    plain, fused = peft_pair()
    x = torch.randn(3, 5, 64)
    y0, gx0, g0 = grads(plain, x)
    y1, gx1, g1 = grads(fused, x)
    torch.testing.assert_close(y1, y0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx1, gx0, rtol=1e-5, atol=1e-5)
    assert g0.keys() == g1.keys() and any("lora_A" in n for n in g0)
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-4, atol=1e-5)


def test_fused_matches_peft_under_bf16_autocast():
    """Same result as peft's path within bf16 resolution when the update is large enough for both to see."""
    plain, fused = peft_pair(b_scale=0.5)
    for m in (plain, fused):
        m.base_model.model.proj.base_layer.to(torch.bfloat16)
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y0, gx0, g0 = grads(plain, x)
        y1, gx1, g1 = grads(fused, x)
    assert y1.dtype == torch.bfloat16 and gx1.dtype == torch.bfloat16
    torch.testing.assert_close(y1.float(), y0.float(), rtol=0.02, atol=0.05)
    for name in g0:
        assert g1[name].dtype == torch.float32  # master weights keep fp32 gradients
        torch.testing.assert_close(g1[name], g0[name], rtol=0.05, atol=0.05 * g0[name].abs().max().item())


def seen_fraction(model, x, base_out, delta):
    """How much of the exact adapter update `delta` shows in the bf16 output: least-squares coefficient."""
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        shift = model(x).float() - base_out
    return float((shift * delta).sum() / (delta * delta).sum())


def test_update_below_half_an_ulp_survives_bf16():
    """An update far below bf16 resolution: peft's path (base rounded to bf16, then the add rounded again) loses
    most of it; the fused path rounds once from an fp32 sum, so the update shows in expectation."""
    plain, fused = peft_pair(b_scale=5e-5)
    layer = plain.base_model.model.proj
    for m in (plain, fused):
        m.base_model.model.proj.base_layer.to(torch.bfloat16)
    x = torch.randn(4096, 64).to(torch.bfloat16)
    with torch.no_grad():
        base_out = layer.base_layer(x).float()
        a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        delta = (x.float() @ a.T @ b.T) * layer.scaling["default"]
        spacing = torch.finfo(torch.bfloat16).eps * base_out.abs()
    assert (delta.abs() < spacing / 2).float().mean() > 0.9  # the update is below half an ulp almost everywhere
    assert seen_fraction(plain, x, base_out, delta) < 0.3
    assert seen_fraction(fused, x, base_out, delta) == pytest.approx(1.0, abs=0.15)


def test_other_cases_take_peft_forward():
    _, with_dropout = peft_pair(dropout=0.1)
    layer = with_dropout.base_model.model.proj
    assert isinstance(layer, LoraLinear) and layer._fused_adapter() is None
    _, fused = peft_pair()
    layer = fused.base_model.model.proj
    assert layer._fused_adapter() == "default"
    with fused.disable_adapter():
        assert layer._fused_adapter() is None
        x = torch.randn(2, 64)
        torch.testing.assert_close(fused(x), layer.base_layer(x))


def test_saved_adapter_is_scored_through_the_fused_layer(tmp_path):
    """Eval loads an adapter with load_adapter: it must compute what training's forward computed, small
    updates included (peft's own forward would drop them in bf16)."""
    from tunelab.model.adapters import load_adapter

    _, fused = peft_pair(b_scale=5e-5)
    fused.save_pretrained(tmp_path)
    torch.manual_seed(0)  # the same base weights as peft_pair's
    loaded = load_adapter(Block(), tmp_path)
    for m in (fused, loaded):
        m.base_model.model.proj.base_layer.to(torch.bfloat16)
    assert isinstance(loaded.base_model.model.proj, LoraLinear)
    x = torch.randn(256, 64).to(torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), fused(x), rtol=0, atol=0)


def test_packed_inference_weight_computes_the_fused_result_from_one_copy_of_w():
    """pack_for_inference: W becomes a view of [W | sB], inference gives exactly the fused result, a changed B
    is picked up, and with autograd on the layer trains as before."""
    _, fused = peft_pair()
    reference = copy.deepcopy(fused)
    assert pack_for_inference(fused) == 1
    layer = fused.base_model.model.proj
    packed, _ = layer._packed
    assert layer.base_layer.weight.untyped_storage().data_ptr() == packed.untyped_storage().data_ptr()
    x = torch.randn(7, 64)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), reference(x), rtol=0, atol=0)
        for m in (fused, reference):
            m.base_model.model.proj.lora_B["default"].weight.mul_(-3.0)
        torch.testing.assert_close(fused(x), reference(x), rtol=0, atol=0)
    y0, gx0, g0 = grads(reference, x)
    y1, gx1, g1 = grads(fused, x)
    torch.testing.assert_close(y1, y0, rtol=0, atol=0)
    torch.testing.assert_close(gx1, gx0, rtol=1e-6, atol=1e-6)
    assert g0.keys() == g1.keys()
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-6, atol=1e-6)


def nf4_linear(dense: torch.nn.Linear) -> torch.nn.Module:
    """A bitsandbytes nf4 copy of `dense` computing in bf16 (QLoRA's base layer)."""
    bnb = pytest.importorskip("bitsandbytes")
    quantized = bnb.nn.Linear4bit(dense.in_features, dense.out_features, bias=True,
                                  compute_dtype=torch.bfloat16, quant_type="nf4")
    quantized.load_state_dict(dense.state_dict())
    quantized.bias.data = quantized.bias.data.to(torch.bfloat16)
    return quantized.to("cpu")  # bitsandbytes quantizes on the move to a device


def test_nf4_base_takes_the_fused_path_and_keeps_small_updates():
    plain, fused = peft_pair(b_scale=5e-5, nf4=True)
    layer = plain.base_model.model.proj
    assert fused.base_model.model.proj._fused_adapter() == "default"
    x = torch.randn(4096, 64).to(torch.bfloat16)
    with torch.no_grad():
        base_out = layer.base_layer(x).float()
        a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        delta = (x.float() @ a.T @ b.T) * layer.scaling["default"]
    assert seen_fraction(plain, x, base_out, delta) < 0.3
    assert seen_fraction(fused, x, base_out, delta) == pytest.approx(1.0, abs=0.15)


def test_nf4_base_fused_gradients_match_peft():
    plain, fused = peft_pair(b_scale=0.5, nf4=True)
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y0, gx0, g0 = grads(plain, x)
        y1, gx1, g1 = grads(fused, x)
    torch.testing.assert_close(y1.float(), y0.float(), rtol=0.02, atol=0.05)
    torch.testing.assert_close(gx1.float(), gx0.float(), rtol=0.05, atol=0.05 * gx0.abs().max().item())
    assert g0.keys() == g1.keys() and any("lora_B" in n for n in g0)
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=0.05, atol=0.05 * g0[name].abs().max().item())
