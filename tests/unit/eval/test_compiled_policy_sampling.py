"""A compiled policy (recipes' compile_blocks: GRPO and SFT's `compile`) samples through eval/sampling.py as the
eager policy does: over prepacked weights (its LoRA layers hold no [W | sB] of their own), its blocks not compiled
again for the sampler's shapes, its completions and log-probs the eager policy's."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from tests.conftest import make_tiny_llama
from tunelab.eval.sampling import sample
from tunelab.model import lora_linear, prepack

PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [17, 18, 19]] * 3  # 9 rows: enough for reordered weights


def policy(dtype, compiled: bool):
    model = get_peft_model(make_tiny_llama(64, seed=4), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    lora_linear.use_fused_lora(model)
    model = model.to(dtype)
    if compiled:  # as recipes/grpo.build_policy: compiled blocks, no [W | sB] packing
        for block in model.get_decoder().layers:
            block.compile()
    else:
        assert lora_linear.pack_for_inference(model) > 0
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_policy_samples_over_prepacked_weights_as_the_eager_one(monkeypatch, dtype):
    import torch._dynamo.utils as dynamo_utils

    eager, compiled = policy(dtype, False), policy(dtype, True)
    want = sample(eager, PROMPTS, 5, [63], 0, temperature=0, logprobs=True)
    packed = []
    real = lora_linear.LoraLinear._inference_forward
    monkeypatch.setattr(
        lora_linear.LoraLinear,
        "_inference_forward",
        lambda self, x, name, weight: (
            packed.append(self._prepacked is not None or weight is not None) or real(self, x, name, weight)
        ),
    )
    graphs = dynamo_utils.counters["stats"]["unique_graphs"]
    got = sample(compiled, PROMPTS, 5, [63], 0, temperature=0, logprobs=True)
    assert dynamo_utils.counters["stats"]["unique_graphs"] == graphs  # the blocks ran eager, nothing compiled
    assert packed and all(packed)  # every LoRA layer call took the packed inference path
    reorders = prepack.applies(compiled, len(PROMPTS))
    bf16_products = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert reorders == (dtype == torch.float32 or bf16_products) or not torch.backends.mkldnn.is_available()
    assert got.ids == want.ids
    tol = 1e-4 if dtype == torch.float32 else 0.05
    for a, b in zip(want.logps, got.logps):
        torch.testing.assert_close(torch.tensor(b), torch.tensor(a), atol=tol, rtol=0)
    for m in compiled.modules():  # nothing kept after the call: the compiled update sees its own layers
        assert getattr(m, "_packed", None) is None and getattr(m, "_prepacked", None) is None
