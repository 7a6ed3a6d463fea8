"""Mixture-of-Experts models in plan: families.py reads each MoE family's shape from its transformers config (the
key names of transformers' own configuration classes), Arch counts total parameters (memory) apart from active
ones (FLOPs), and families tunelab does not implement are refused in one line by name."""

from __future__ import annotations

import pytest

from tunelab import families
from tunelab.errors import TunelabError
from tunelab.plan.arch import from_hf_config

SMALL = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=256)


def hf_config(name: str, **fields):
    import transformers

    return getattr(transformers, name)(**{**SMALL, **fields})


# (config class, its fields, experts, top_k, expert width, shared width, sparse layers)
FAMILY_CONFIGS = [
    ("Qwen3MoeConfig", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32), 8, 2, 32, 0, (0, 1, 2, 3)),
    (
        "Qwen3MoeConfig",
        dict(
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=2, mlp_only_layers=[3]
        ),
        8,
        2,
        32,
        0,
        (1,),
    ),
    (
        "Qwen2MoeConfig",
        dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=48),
        6,
        2,
        24,
        48,
        (0, 1, 2, 3),
    ),
    (
        "MixtralConfig",
        dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=40),
        4,
        2,
        40,
        0,
        (0, 1, 2, 3),
    ),
    ("OlmoeConfig", dict(num_experts=16, num_experts_per_tok=4, intermediate_size=16), 16, 4, 16, 0, (0, 1, 2, 3)),
    (
        "GptOssConfig",
        dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, head_dim=16),
        8,
        2,
        32,
        0,
        (0, 1, 2, 3),
    ),
]


@pytest.mark.parametrize("name, fields, experts, top_k, width, shared, sparse", FAMILY_CONFIGS)
def test_each_moe_family_is_read_from_its_own_config_keys(name, fields, experts, top_k, width, shared, sparse):
    config = hf_config(name, **fields)
    moe = families.moe_shape(config, "m")
    assert (moe.experts, moe.top_k, moe.expert_width, moe.shared_width, moe.sparse_layers) == (
        experts,
        top_k,
        width,
        shared,
        sparse,
    )
    assert moe.aux_coef == config.router_aux_loss_coef
    arch = from_hf_config("m", config, "config.json")
    assert arch.moe == moe


def test_total_counts_every_expert_and_active_only_the_routed_ones():
    """A Qwen2-MoE block: the shared expert and its gate and the router are active for every token, top_k of the
    routed experts are; the dense layer (mlp_only_layers) keeps its intermediate_size MLP."""
    h, e, k, w, s, i = 64, 6, 2, 24, 48, 80
    config = hf_config(
        "Qwen2MoeConfig",
        num_experts=e,
        num_experts_per_tok=k,
        moe_intermediate_size=w,
        shared_expert_intermediate_size=s,
        intermediate_size=i,
        mlp_only_layers=[0],
    )
    arch = from_hf_config("m", config, "config.json")
    attention = 4 * (h * 64 + 2 * h * 32 + 64 * h)  # q, k (2 heads of 16), v, o over four layers
    block = lambda routed: routed * 3 * h * w + 3 * h * s + h * e + h  # noqa: E731 experts, shared, router, gate
    assert arch.block_linear_params == attention + 3 * h * i + 3 * block(e)
    assert arch.active_block_params == attention + 3 * h * i + 3 * block(k)
    assert arch.total_params - arch.active_params == 3 * (e - k) * 3 * h * w
    assert arch.matmul_params == arch.active_block_params + arch.vocab * h


def test_a_dense_model_has_no_moe_and_equal_active_and_total():
    arch = from_hf_config("m", hf_config("LlamaConfig", intermediate_size=128), "config.json")
    assert arch.moe is None and arch.active_params == arch.total_params


@pytest.mark.parametrize("top_k", [0, 9])
def test_a_top_k_the_experts_cannot_serve_is_one_line(top_k):
    config = hf_config("MixtralConfig", num_local_experts=8, num_experts_per_tok=2)
    config.num_experts_per_tok = top_k  # the config class itself does not check it
    with pytest.raises(TunelabError, match=f"num_experts_per_tok={top_k} .* between 1 and num_local_experts=8"):
        families.check(config, "m", planning=True)


@pytest.mark.parametrize(
    "name, fields, message",
    [
        ("DeepseekV3Config", dict(n_routed_experts=8), "multi-head latent attention"),
        ("JambaConfig", dict(num_experts=4), "Mamba layers"),
        ("JetMoeConfig", dict(num_local_experts=4), "mixture of attention heads"),
    ],
)
def test_moe_families_tunelab_does_not_implement_are_refused_by_name(name, fields, message):
    config = hf_config(name, **fields)
    with pytest.raises(TunelabError) as e:
        families.check(config, "m", planning=True)
    line = str(e.value)
    assert "\n" not in line and message in line and "Qwen3-MoE" in line  # what it would take instead


def test_an_unknown_moe_family_is_refused_naming_the_known_ones():
    from types import SimpleNamespace

    config = SimpleNamespace(model_type="newmoe", num_experts=4)
    with pytest.raises(
        TunelabError, match=r"newmoe .*\(num_experts=4 .* does not know; the MoE families it knows: Qwen3-MoE"
    ):
        families.check(config, "m")
