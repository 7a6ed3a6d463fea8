"""eval/sampling.py: the KV-cache loop equals decoding without a cache, stops at a stop id, counts clipped rows,
and draws reproducibly from its generator."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_tiny_llama
from tunelab.eval.sampling import draw, pick, sample

PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [17, 18, 19]]


def greedy_without_cache(model, prompt, steps):
    ids = list(prompt)
    for _ in range(steps):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def test_greedy_with_cache_equals_full_recompute():
    model = make_tiny_llama(64, seed=3).float()
    out = sample(model, PROMPTS, 6, stop_ids=[63], pad_id=0, temperature=0)
    for prompt, got, clipped in zip(PROMPTS, out.ids, out.clipped):
        want = greedy_without_cache(model, prompt, 6)
        if 63 in want:
            want = want[: want.index(63) + 1]
        assert got == want
        assert clipped == (63 not in want)


def test_stops_at_stop_id_and_keeps_it():
    model = make_tiny_llama(64, seed=3).float()
    first = sample(model, PROMPTS, 1, stop_ids=[63], pad_id=0, temperature=0)
    stop = first.ids[0][0]
    out = sample(model, PROMPTS, 5, stop_ids=[stop], pad_id=0, temperature=0)
    assert out.ids[0] == [stop] and not out.clipped[0]


def test_sampling_reproducible_from_generator_state():
    model = make_tiny_llama(64, seed=3).float()
    gen = torch.Generator().manual_seed(7)
    state = gen.get_state()
    a = sample(model, PROMPTS * 2, 8, stop_ids=[63], pad_id=0, temperature=1.0, top_p=0.9, generator=gen)
    gen.set_state(state)
    b = sample(model, PROMPTS * 2, 8, stop_ids=[63], pad_id=0, temperature=1.0, top_p=0.9, generator=gen)
    assert a == b
    assert len({tuple(x) for x in a.ids}) > 1


def test_top_p_keeps_the_nucleus_only():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    gen = torch.Generator().manual_seed(0)
    draws = {int(pick(logits, 1.0, 0.7, gen)) for _ in range(200)}
    assert draws == {0, 1}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_training_mode_restored(temperature):
    model = make_tiny_llama(64, seed=3).float()
    model.train()
    sample(model, PROMPTS, 2, stop_ids=[63], pad_id=0, temperature=temperature)
    assert model.training


def test_repeated_prompts_share_one_prefill_and_decode_as_if_each_had_its_own():
    model = make_tiny_llama(64, seed=3).float()
    repeated = [p for p in PROMPTS for _ in range(3)]  # GRPO's G copies of each prompt
    calls = []
    handle = model.register_forward_pre_hook(
        lambda m, args, kwargs: calls.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    try:
        out = sample(model, repeated, 4, stop_ids=[63], pad_id=0, temperature=0)
    finally:
        handle.remove()
    assert calls[0][0] == len(PROMPTS)  # the prefill ran over the distinct prompts only
    assert all(shape[0] == len(repeated) for shape in calls[1:])
    alone = sample(model, PROMPTS, 4, stop_ids=[63], pad_id=0, temperature=0)
    assert out.ids == [ids for ids in alone.ids for _ in range(3)]


class OlderForward(torch.nn.Module):
    """A causal LM as transformers 5.17 calls it: the KV cache under `past_key_values`, other keywords swallowed."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.config = model, model.config

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None, **kw):
        import inspect

        from transformers import LlamaModel

        assert "cache" not in kw, "5.17 would swallow `cache` and decode without the earlier tokens"
        installed = "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"
        return self.inner(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            use_cache=use_cache, **{installed: past_key_values}, **kw,
        )  # fmt: skip


def test_the_cache_goes_under_the_keyword_the_installed_transformers_takes(monkeypatch):
    import inspect

    from transformers import LlamaModel

    from tunelab.eval import sampling

    assert sampling.cache_keyword() in inspect.signature(LlamaModel.forward).parameters
    model = make_tiny_llama(64, seed=3).float()
    monkeypatch.setattr(sampling, "cache_keyword", lambda: "past_key_values")
    out = sample(OlderForward(model), PROMPTS, 6, stop_ids=[63], pad_id=0, temperature=0)
    for prompt, got in zip(PROMPTS, out.ids):
        want = greedy_without_cache(model, prompt, 6)
        assert got == (want[: want.index(63) + 1] if 63 in want else want)


def test_draw_follows_the_weights_and_never_draws_a_zero_weight():
    weights = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0]]).repeat(4000, 1)
    got = draw(weights, torch.Generator().manual_seed(1))
    counts = torch.bincount(got, minlength=6).double() / got.numel()
    assert counts[[0, 2, 5]].sum() == 0
    torch.testing.assert_close(counts[[1, 3, 4]], torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64), atol=0.03, rtol=0)
    # The last entry with weight keeps its mass (a running sum rounding below the total must not lose it).
    last = draw(torch.tensor([[1e-8, 0.0, 1.0]]).repeat(500, 1), torch.Generator().manual_seed(2))
    assert set(last.tolist()) <= {0, 2} and (last == 2).all()


def test_rows_enough_for_prepacked_weights_decode_as_the_plain_product(monkeypatch):
    """At MIN_ROWS rows or more the sampler runs over weights reordered once (model/prepack.py): greedy output
    equals the plain product's, and a seeded draw the same tokens."""
    from tunelab.model import prepack

    model = make_tiny_llama(64, seed=3).float()
    prompts = (PROMPTS * prepack.MIN_ROWS)[: prepack.MIN_ROWS + 1]
    if not prepack.applies(model, len(prompts)):
        pytest.skip("weights are reordered on AVX2 and AVX-512 CPUs with oneDNN only")
    calls = []
    monkeypatch.setattr(prepack, "reorder", lambda w, rows, real=prepack.reorder: calls.append(rows) or real(w, rows))
    packed = sample(model, prompts, 6, stop_ids=[63], pad_id=0, temperature=0)
    drawn = sample(model, prompts, 6, [63], 0, 1.0, 0.9, torch.Generator().manual_seed(5))
    assert calls and set(calls) == {len(prompts)}
    monkeypatch.setattr(prepack, "MIN_ROWS", 10**6)
    assert sample(model, prompts, 6, stop_ids=[63], pad_id=0, temperature=0) == packed
    assert sample(model, prompts, 6, [63], 0, 1.0, 0.9, torch.Generator().manual_seed(5)) == drawn


@pytest.mark.parametrize("decode", ["static", pytest.param("compiled", marks=pytest.mark.slow)])
def test_static_cache_decodes_as_the_growing_cache(decode):
    """decoding.py's static modes (a preallocated cache; compiled, the step under torch.compile) give the dynamic
    mode's greedy tokens, their log-probs (what GRPO scores at generation) and seeded draws, and a second call of
    the same shape reuses the reset cache; over enough rows for the dynamic mode's prepacked weights."""
    model = make_tiny_llama(64, seed=3).float()
    prompts = PROMPTS * 3
    want = sample(model, prompts, 7, stop_ids=[63], pad_id=0, temperature=0, decode="dynamic", logprobs=True)
    drawn = sample(model, prompts, 7, [63], 0, 1.0, 0.9, torch.Generator().manual_seed(5), decode="dynamic")
    for _ in range(2):
        got = sample(model, prompts, 7, stop_ids=[63], pad_id=0, temperature=0, decode=decode, logprobs=True)
        assert got.ids == want.ids
        for ids, a, b in zip(want.ids, want.logps, got.logps):
            assert len(a) == len(b) == len(ids)
            torch.testing.assert_close(torch.tensor(b), torch.tensor(a), atol=1e-4, rtol=0)
        got = sample(model, prompts, 7, [63], 0, 1.0, 0.9, torch.Generator().manual_seed(5), decode=decode)
        assert got == drawn
    assert len(model._tunelab_static_caches) == 1


def test_logprobs_are_a_full_forwards_at_the_sampling_temperature():
    model = make_tiny_llama(64, seed=3).float()
    greedy = sample(model, PROMPTS, 6, stop_ids=[63], pad_id=0, temperature=0, logprobs=True)
    drawn = sample(model, PROMPTS, 6, [63], 0, 0.7, 1.0, torch.Generator().manual_seed(5), logprobs=True)
    for out, temperature in ((greedy, 1.0), (drawn, 0.7)):
        for prompt, ids, logps in zip(PROMPTS, out.ids, out.logps):
            want = full_logps(model, prompt, ids, temperature)
            torch.testing.assert_close(torch.tensor(logps), torch.tensor(want), atol=1e-4, rtol=0)
    assert sample(model, PROMPTS, 6, [63], 0, temperature=0).logps is None


def full_logps(model, prompt, completion, temperature):
    """Each completion token's log-probability from one forward over prompt + completion, without a cache."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float() / temperature, -1)
    return [float(logp[len(prompt) - 1 + k, t]) for k, t in enumerate(completion)]


def test_auto_decode_is_dynamic_on_cpu_and_compiled_on_cuda():
    from tunelab import decoding

    assert decoding.resolve("auto", "cpu").name == "dynamic"
    assert decoding.resolve("auto", "cuda").compiled and decoding.resolve("auto", "cuda").static_cache
    assert decoding.resolve("static", "cuda").name == "static"
