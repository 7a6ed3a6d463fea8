"""The explicit-product slot attention (model/attention.py) against PyTorch's own causal SDPA."""

import pytest
import torch
import torch.nn.functional as F

from tunelab.model.attention import _SlotAttention


def _inputs(dtype, heads=6, kv_heads=2, slots=3, length=7, dim=8):
    torch.manual_seed(0)
    shapes = [(slots, heads, length, dim), (slots, kv_heads, length, dim), (slots, kv_heads, length, dim)]
    return [torch.randn(s, dtype=dtype, requires_grad=True) for s in shapes], torch.randn(shapes[0], dtype=dtype)


def _run(fn, inputs, grad_out):
    for x in inputs:
        x.grad = None
    out = fn(*inputs)
    out.backward(grad_out.to(out.dtype))  # as the next layer hands it back: in the output's dtype
    return [out.detach().float()] + [x.grad.float() for x in inputs]


def _reference(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)


@pytest.mark.parametrize("kv_heads", [1, 2, 6])
def test_slot_attention_matches_sdpa_fp32(kv_heads):
    """Output and the gradients of q, k and v, with the query heads folded onto shared KV heads (the
    grouping transformers' repeat_kv uses: query head i reads KV head i // groups)."""
    inputs, grad_out = _inputs(torch.float32, kv_heads=kv_heads)
    ours = _run(lambda q, k, v: _SlotAttention.apply(q, k, v, 0.3), inputs, grad_out)
    reference = _run(_reference, inputs, grad_out)
    for name, a, b in zip(["out", "dq", "dk", "dv"], ours, reference):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), name


def test_slot_attention_bf16_error_is_that_of_bf16_sdpa():
    """In bf16 the products round their inputs and outputs to 8 mantissa bits; the softmax itself runs in
    fp32. The error against an fp32 reference must stay within what bf16 SDPA itself makes (x2 margin)."""
    inputs, grad_out = _inputs(torch.bfloat16, length=33, dim=16)
    exact = _run(_reference, [x.detach().float().requires_grad_() for x in inputs], grad_out.float())
    ours = _run(lambda q, k, v: _SlotAttention.apply(q, k, v, 0.3), inputs, grad_out)
    sdpa_bf16 = _run(_reference, inputs, grad_out)
    for name, a, b, ref in zip(["out", "dq", "dk", "dv"], ours, sdpa_bf16, exact):
        assert (a - ref).abs().max() <= 2 * (b - ref).abs().max() + 1e-3, name


def test_slot_attention_bf16_gives_a_one_key_row_no_query_gradient():
    """The first position attends to itself alone: its softmax is constant, so its query gets no gradient.
    In bf16 that holds exactly only when the softmax correction comes from the same rounded dP it is
    subtracted from (rowsum(P * dP)), not from rowsum(dO * O), which rounds differently."""
    inputs, grad_out = _inputs(torch.bfloat16, length=33, dim=16)
    _, dq, _, _ = _run(lambda q, k, v: _SlotAttention.apply(q, k, v, 0.3), inputs, grad_out)
    assert dq[:, :, 0].abs().max() == 0
    assert dq[:, :, 1:].abs().max() > 0


def test_slot_attention_under_autocast_takes_fp32_inputs():
    """With fp32 weights under bf16 autocast (QLoRA, full fine-tuning), RoPE leaves q and k in fp32 while the
    products run in bf16; the backward, which autograd runs outside autocast, must cast the same way."""
    inputs, grad_out = _inputs(torch.float32, length=33, dim=16)
    exact = _run(_reference, inputs, grad_out)

    def forward_under_autocast(q, k, v):  # the backward runs outside it, as in the training loop
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return _SlotAttention.apply(q, k, v, 0.3)

    ours = _run(forward_under_autocast, inputs, grad_out)
    assert all(x.grad.dtype == torch.float32 for x in inputs)
    for name, a, ref in zip(["out", "dq", "dk", "dv"], ours, exact):
        assert torch.allclose(a, ref, atol=0.05, rtol=0.05), name


def test_rows_attention_is_sdpas_causal_attention_over_whole_rows_and_sdpa_under_a_mask():
    """GRPO's rollouts (attention.rows_attention): whole rows without a mask run as one causal slot each, with SDPA's
    logits and gradients (fp32); a sliding window shorter than the rows gets transformers' mask and SDPA; sampling
    (with_padding_masks) runs on SDPA."""
    from transformers import MistralConfig, MistralForCausalLM

    from tests.conftest import TINY_SHAPE, make_tiny_llama
    from tunelab.model import attention

    def mistral(impl):  # a sliding window of 4 over rows of 9
        torch.manual_seed(7)
        config = MistralConfig(**TINY_SHAPE, vocab_size=64, sliding_window=4, attn_implementation=impl)
        return MistralForCausalLM(config)

    name = attention.register_rows()
    ids = torch.randint(0, 64, (3, 9))
    for window in (None, 4):
        build = (lambda impl: make_tiny_llama(64, seed=7, attn_implementation=impl)) if window is None else mistral
        models = [build(impl) for impl in (name, "sdpa")]
        calls = []
        real = attention._SlotAttention.apply
        attention._SlotAttention.apply = lambda *a: calls.append(1) or real(*a)
        try:
            outs = []
            for model in models:
                logits = model(input_ids=ids).logits
                logits.square().mean().backward()
                outs.append([logits.detach(), *(p.grad for p in model.parameters())])
        finally:
            attention._SlotAttention.apply = real
        assert bool(calls) == (window is None)  # the products over whole causal rows only
        for a, b in zip(*outs):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    with attention.with_padding_masks(models[0]):
        assert models[0].config._attn_implementation == "sdpa"
    assert models[0].config._attn_implementation == name


def test_slots_run_as_products_up_to_the_measured_length_of_their_block_and_precision(monkeypatch):
    """runtime.SLOT_MAX_LEN: a compiled block runs longer slots as explicit products than an eager one, and 16-bit
    products longer ones than fp32, where SDPA's flash kernel was faster beyond (the crossover record); the choice is
    made while dynamo traces the block, so it is part of the compiled graph. plan prices the same lengths."""
    from types import SimpleNamespace

    from tunelab.model import attention
    from tunelab.runtime import SLOT_MAX_LEN, slot_max_len

    module = SimpleNamespace(training=True, is_causal=True)
    sdpa_calls = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: sdpa_calls.append(1) or real_sdpa(*a, **k)
    )

    def runs_sdpa(length: int, dtype, compiled: bool) -> bool:
        q, k, v = (torch.randn(2, 2, length, 8, dtype=dtype) for _ in range(3))
        fn = lambda q, k, v: attention.rows_attention(module, q, k, v, None)[0]  # noqa: E731
        sdpa_calls.clear()
        if not compiled:
            fn(q, k, v)
            return bool(sdpa_calls)
        graphs = []

        def backend(gm, example_inputs):  # what dynamo traced: SDPA's call or the products
            graphs.append(any("scaled_dot_product" in str(node.target) for node in gm.graph.nodes))
            return gm.forward

        torch._dynamo.reset()
        torch.compile(fn, backend=backend)(q, k, v)
        return any(graphs) or bool(sdpa_calls)

    try:
        for (compiled, half), longest in SLOT_MAX_LEN.items():
            dtype = torch.bfloat16 if half else torch.float32
            assert slot_max_len(compiled, half) == longest
            assert not runs_sdpa(longest, dtype, compiled), (compiled, half, longest)
            assert runs_sdpa(longest + 16, dtype, compiled), (compiled, half, longest + 16)
    finally:
        torch._dynamo.reset()
