"""model/prepack.py: weights reordered once for CPU decoding give the plain product's results, follow the adapter as
it stands on entry, train as before under autograd, and leave every layer as it was on exit."""

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model

from tests.conftest import make_tiny_llama
from tunelab.model import prepack
from tunelab.model.lora_linear import pack_for_inference, use_fused_lora

ROWS = prepack.MIN_ROWS

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available()
    or not torch.backends.cpu.get_cpu_capability().startswith(prepack.CAPABILITIES),
    reason="reorders on AVX2 and AVX-512 CPUs with oneDNN only",
)


def lora_llama(seed=0, dtype=torch.float32):
    base = make_tiny_llama(64, seed=seed).to(dtype)  # the adapter's A and B stay fp32 (peft's default)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    assert use_fused_lora(model) > 0
    pack_for_inference(model)
    return model.eval()


def untouched(model):
    """No layer keeps an instance forward or a reordered weight, and the model is not marked."""
    assert not getattr(model, prepack._ACTIVE, False)
    for m in model.modules():
        assert "forward" not in vars(m)
        assert getattr(m, "_prepacked", None) is None
        assert getattr(m, "_prepacked_a", None) is None and getattr(m, "_prepacked_name", None) is None


def test_applies_to_fp32_and_bf16_cpu_weights_with_enough_rows_only(monkeypatch):
    model = make_tiny_llama(64)
    assert prepack.applies(model, ROWS)
    assert not prepack.applies(model, ROWS - 1)
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    assert prepack.applies(bf16, ROWS) == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert not prepack.applies(copy.deepcopy(model).to(torch.float16), ROWS)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not prepack.applies(model, ROWS)  # fp32 weights whose products autocast runs in bf16
        assert prepack.applies(bf16, ROWS) == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert not prepack.applies(bf16, ROWS)
    monkeypatch.undo()
    with prepack.prepacked(model, ROWS - 1) as layers:
        assert layers == 0
    untouched(model)
    for capability in ("AVX2", "AVX512", "AVX512_VNNI"):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        assert prepack.applies(model, ROWS)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert not prepack.applies(model, ROWS)


def test_plain_model_gives_the_plain_logits_and_is_restored():
    model = make_tiny_llama(64, seed=1).eval()
    ids = torch.randint(0, 64, (ROWS, 5))
    with torch.no_grad():
        want = model(input_ids=ids).logits
        with prepack.prepacked(model, ROWS) as layers:
            assert layers == sum(type(m) is torch.nn.Linear for m in model.modules())
            assert all("forward" in vars(m) for m in model.modules() if type(m) is torch.nn.Linear)
            got = model(input_ids=ids).logits
            single = model(input_ids=ids[:1]).logits  # any row count works
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(single, want[:1], rtol=1e-5, atol=1e-5)
    untouched(model)


def test_lora_model_uses_the_adapter_as_it_stands_on_entry():
    model = lora_llama()
    reference = copy.deepcopy(model)
    ids = torch.randint(0, 64, (ROWS, 6))
    with torch.no_grad():
        for m in (model, reference):  # B moves between optimizer steps; the block must see the latest
            for name, p in m.named_parameters():
                if "lora_B" in name:
                    p.mul_(-2.0)
        want = reference(input_ids=ids).logits
        with prepack.prepacked(model, ROWS) as layers:
            fused = [m for m in model.modules() if getattr(m, "_prepacked", None) is not None]
            assert fused and layers == len(fused) + 1  # the fused layers and the untargeted LM head
            got = model(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    untouched(model)


def test_autograd_inside_the_block_takes_the_training_path():
    model = lora_llama(seed=2)
    reference = copy.deepcopy(model)
    ids = torch.randint(0, 64, (2, 6))
    with prepack.prepacked(model, ROWS):
        model(input_ids=ids, labels=ids).loss.backward()
    reference(input_ids=ids, labels=ids).loss.backward()
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="oneDNN has no bf16 products here")
def test_bf16_lora_model_gives_the_packed_layers_logits_over_reordered_weights():
    """bf16 weights: each fused layer's [W | sB] is reordered (not merged: that would round the update away) and A
    cast once; the logits are the packed layers' (bit-identical on the AVX-512 BF16 class), B as it stands on entry."""
    model = lora_llama(seed=5, dtype=torch.bfloat16)
    ids = torch.randint(0, 64, (ROWS, 6))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(-2.0)
        want = model(input_ids=ids).logits
        with prepack.prepacked(model, ROWS) as layers:
            fused = [m for m in model.modules() if getattr(m, "_prepacked_a", None) is not None]
            assert fused and layers == len(fused) + 1  # the fused layers and the untargeted LM head
            assert all(m._prepacked_a.dtype == torch.bfloat16 for m in fused)
            got = model(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
    assert (got == want).float().mean() > 0.99
    untouched(model)


def test_a_layer_kept_in_another_dtype_keeps_torchs_product():
    model = make_tiny_llama(64, seed=4).eval()
    model.lm_head.to(torch.bfloat16)
    with torch.no_grad(), prepack.prepacked(model, ROWS) as layers:
        assert "forward" not in vars(model.lm_head)
        assert layers == sum(type(m) is torch.nn.Linear for m in model.modules()) - 1
    untouched(model)


def test_nested_blocks_reuse_the_outer_weights_and_a_replaced_forward_is_kept():
    model = make_tiny_llama(64).eval()
    hooked = model.lm_head
    hooked.forward = lambda x: torch.zeros(*x.shape[:-1], 64)  # as accelerate's offload hooks replace forward
    with prepack.prepacked(model, ROWS) as outer:
        assert vars(hooked)["forward"].__name__ == "<lambda>"
        with prepack.prepacked(model, ROWS) as inner:
            assert inner == 0
        assert outer > 0 and all(
            "forward" in vars(m) for m in model.modules() if type(m) is torch.nn.Linear and m is not hooked
        )
    assert "forward" in vars(hooked)
    del hooked.forward
    untouched(model)
