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
    _, fused = peft_pair()
    layer = fused.base_model.model.proj
    assert layer._fused_adapter() == "default"
    with fused.disable_adapter():
        assert layer._fused_adapter() is None
        x = torch.randn(2, 64)
        torch.testing.assert_close(fused(x), layer.base_layer(x))


def _dropout_reference(layer, x, keep, p):
    """peft's definition, y = xWᵀ + b + s·((x ⊙ keep / (1 - p))Aᵀ)Bᵀ, in plain autograd."""
    a = layer.lora_A["default"].weight.detach().clone().requires_grad_(True)
    b = layer.lora_B["default"].weight.detach().clone().requires_grad_(True)
    x = x.clone().requires_grad_(True)
    base = layer.base_layer
    y = x @ base.weight.T + base.bias + layer.scaling["default"] * ((x * keep / (1 - p)) @ a.T) @ b.T
    (y * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
    return y.detach(), x.grad, a.grad, b.grad


def test_lora_dropout_takes_the_fused_path_and_matches_its_definition():
    """The fused layer draws its keep mask with torch.rand over the flattened input, so re-seeding gives the
    reference the same mask; in eval mode there is no dropout."""
    p = 0.3
    _, fused = peft_pair(dropout=p)
    layer = fused.base_model.model.proj
    assert layer._fused_adapter() == "default"
    x = torch.randn(3, 5, 64)
    torch.manual_seed(7)
    y, gx, g = grads(fused, x)
    torch.manual_seed(7)
    keep = (torch.rand(15, 64) >= p).view(3, 5, 64)
    assert 0.2 < 1 - keep.float().mean() < 0.4
    y0, gx0, ga0, gb0 = _dropout_reference(layer, x, keep, p)
    torch.testing.assert_close(y, y0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx, gx0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g["base_model.model.proj.lora_A.default.weight"], ga0, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(g["base_model.model.proj.lora_B.default.weight"], gb0, rtol=1e-4, atol=1e-5)
    fused.eval()
    torch.testing.assert_close(fused(x).detach(), _dropout_reference(layer, x, torch.ones_like(keep), 0.0)[0])


@pytest.mark.slow
def test_compiled_lora_dropout_backward_uses_the_forwards_mask():
    """Under torch.compile the mask comes from inductor's RNG, so check consistency instead of values: the
    forward's adapter activations xa = drop(x)·Aᵀ follow from y (B has full column rank), and dL/dA·Aᵀ
    must equal gbᵀ·xa with gb = g·sB. A mask drawn again in backward would break the equality."""
    p = 0.5
    _, fused = peft_pair(dropout=p, b_scale=0.5)
    layer = fused.base_model.model.proj
    compiled = torch.compile(fused)
    x = torch.randn(40, 64)
    y = compiled(x)
    g = torch.linspace(-1, 1, y.shape[-1]).expand_as(y)
    (y * g).sum().backward()
    s, a = layer.scaling["default"], layer.lora_A["default"].weight.detach()
    sb = s * layer.lora_B["default"].weight.detach()
    base = layer.base_layer
    xa = (y.detach() - x @ base.weight.T - base.bias) @ torch.linalg.pinv(sb.T)
    # With p = 0.5 about half the inputs are dropped: xa is not x·Aᵀ.
    assert (xa - x @ a.T).abs().max() > 0.1
    torch.testing.assert_close(layer.lora_A["default"].weight.grad @ a.T, (g @ sb).T @ xa, rtol=1e-3, atol=1e-3)


def test_hash_bits_are_lowbias32_and_hashed_masks_drop_p_independently():
    from tunelab.model.lora_linear import _hash_bits, _hashed_keep

    def lowbias32(i):  # Python integers: no overflow to reason about
        i = ((i ^ (i >> 16)) * 0x7FEB352D) & 0xFFFFFFFF
        i = ((i ^ (i >> 15)) * 0x846CA68B) & 0xFFFFFFFF
        return i ^ (i >> 16)

    seed = 4_294_967_000  # index + seed wraps past 2^32 within the tensor
    got = _hash_bits(torch.Size([64, 8]), torch.tensor(seed)).flatten().tolist()
    assert got == [lowbias32((i + seed) % 2**32) for i in range(512)]

    p, x = 0.05, torch.zeros(4096, 576, dtype=torch.bfloat16)

    def two_masks(t):
        seeds = torch.randint(0, 2**32, (2,), dtype=torch.int64)
        return _hashed_keep(t.shape, seeds[0], p), _hashed_keep(t.shape, seeds[1], p)

    first, second = torch.compile(two_masks)(x)
    n = x.numel()
    sigma = (p * (1 - p) / n) ** 0.5
    for keep in (first, second):
        assert abs((1 - keep.float().mean().item()) - p) < 5 * sigma
    # Two calls draw two seeds: agreement is that of independent masks, (1-p)^2 + p^2.
    agree, expected = (first == second).float().mean().item(), (1 - p) ** 2 + p**2
    assert abs(agree - expected) < 5 * (expected * (1 - expected) / n) ** 0.5


def test_saved_adapter_is_scored_through_the_fused_layer(tmp_path):
    """Eval loads an adapter with load_adapter: it must compute what training's forward computed, small
    updates included (peft's own forward would drop them in bf16)."""
    from tunelab.model.adapters import load_adapter

    _, fused = peft_pair(b_scale=5e-5)
    fused.save_pretrained(tmp_path)
    torch.manual_seed(0)  # the same base weights as peft_pair's
    loaded = load_adapter(Block(), tmp_path, "Block")
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
    packed = layer._packed
    assert layer.base_layer.weight.untyped_storage().data_ptr() == packed.untyped_storage().data_ptr()
    x = torch.randn(7, 64)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), reference(x), rtol=0, atol=0)
        for m in (fused, reference):
            m.base_model.model.proj.lora_B["default"].weight.mul_(-3.0)
        torch.testing.assert_close(fused(x), reference(x), rtol=0, atol=0)
    # A fused AdamW step writes B in place without bumping its version counter (GRPO samples right after one).
    for m in (fused, reference):
        b = m.base_model.model.proj.lora_B["default"].weight
        b.grad = torch.ones_like(b)
        torch.optim.AdamW([b], lr=0.1, fused=True).step()
        b.grad = None
    with torch.no_grad():
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
    quantized = bnb.nn.Linear4bit(
        dense.in_features, dense.out_features, bias=True, compute_dtype=torch.bfloat16, quant_type="nf4"
    )
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_packed_layers_inference_forward_traces_as_one_graph(dtype):
    """The compiled decode mode (eval/sampling.py) traces a packed layer's inference forward inside its step: it must
    trace whole (no graph break, which made a resume function per layer, recompiled past dynamo's limit), and give
    the eager forward's output."""
    _, fused = peft_pair(seed=3)
    fused = fused.to(dtype)
    layer = next(m for m in fused.modules() if isinstance(m, LoraLinear))
    pack_for_inference(fused)
    x = torch.randn(5, 64, dtype=dtype)
    torch._dynamo.reset()
    with torch.no_grad():
        want = layer(x)
        got = torch.compile(layer, fullgraph=True, backend="eager")(x)
    assert torch.equal(got, want)
