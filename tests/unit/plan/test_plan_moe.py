"""Mixture-of-Experts models in plan: families.py reads each MoE family's shape from its transformers config (the
key names of transformers' own configuration classes), Arch counts total parameters (memory) apart from active
ones (FLOPs), and families tunelab does not implement are refused in one line by name."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from tunelab import families, methods
from tunelab.api import estimate
from tunelab.cli import main
from tunelab.errors import TunelabError
from tunelab.plan import catalog, fit_rows, memory, steptime
from tunelab.plan.arch import adapter_targets, from_hf_config, from_registry, random_arch
from tunelab.plan.flops import adapter_params, flops_per_token

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


# Each catalog MoE row against its publisher's figures, in the publisher's own convention: (total, active,
# tolerance in B, whether the publisher leaves the embedding lookup out of the active count).
PUBLISHED = {
    "Qwen/Qwen3-30B-A3B": (30.5, 3.3, 0.1, False),  # model card: 30.5B in total and 3.3B activated
    "Qwen/Qwen3-235B-A22B": (235.0, 22.0, 0.5, False),  # model card: 235B in total and 22B activated
    "openai/gpt-oss-20b": (20.91, 3.61, 0.01, True),  # gpt-oss model card: 20.91B total, 3.61B active
    "openai/gpt-oss-120b": (116.83, 5.13, 0.01, True),  # 116.83B total, 5.13B active
    "mistralai/Mixtral-8x7B-v0.1": (46.7, 12.9, 0.05, False),  # Mixtral of Experts: 46.7B, 12.9B active
    "allenai/OLMoE-1B-7B-0924": (6.9, 1.3, 0.05, False),  # OLMoE paper: 6.9B total, 1.3B active
}


@pytest.mark.parametrize("key", PUBLISHED)
def test_catalog_moe_rows_count_their_published_parameters(key):
    total, active, tol, without_embedding = PUBLISHED[key]
    arch = from_registry(key)
    mine = arch.active_params - (arch.embedding_params if without_embedding else 0)
    assert abs(arch.total_params / 1e9 - total) <= tol and abs(mine / 1e9 - active) <= tol
    assert arch.moe is not None and arch.moe.sparse_layers == tuple(range(arch.layers))


def with_experts(arch, experts: int):
    return replace(arch, moe=replace(arch.moe, experts=experts))


def test_flops_follow_active_parameters_and_memory_all_of_them():
    """Doubling the experts at the same top-k leaves a token's FLOPs alone and adds every new expert's weights
    (nf4 under QLoRA) and, with LoRA on the experts, their factors."""
    arch = from_registry("allenai/OLMoE-1B-7B-0924")
    wide = with_experts(arch, 2 * arch.moe.experts)
    targets = adapter_targets(arch, "all-linear")
    assert "experts.gate_up_proj" in targets and "router" not in targets
    f, g = (flops_per_token(a, "qlora", targets, 16, 512, False) for a in (arch, wide))
    assert f.dense == pytest.approx(4 * arch.matmul_params) and g.dense == pytest.approx(f.dense, rel=0.01)
    assert g.adapters == pytest.approx(f.adapters)  # k of E experts' factors a token, whatever E
    added = arch.layers * arch.moe.experts * 3 * arch.hidden * arch.moe.expert_width
    assert wide.block_linear_params - arch.block_linear_params == added + arch.layers * arch.hidden * arch.moe.experts
    nf4 = memory.frozen_weight_bytes(wide, "nf4", 2) - memory.frozen_weight_bytes(arch, "nf4", 2)
    # the experts in 4 bits, the router's new rows (a parameter, not a linear layer bitsandbytes quantizes) in 16
    assert nf4 == pytest.approx(added * memory.NF4_BYTES + arch.layers * arch.hidden * arch.moe.experts * 2)
    lora = adapter_params(wide, targets, 16) - adapter_params(arch, targets, 16)
    per_expert = 16 * (arch.hidden + 2 * arch.moe.expert_width) + 16 * (arch.moe.expert_width + arch.hidden)
    assert lora == arch.layers * arch.moe.experts * per_expert


def test_imbalance_scales_the_expert_products_and_nothing_else():
    arch = from_registry("Qwen/Qwen3-30B-A3B")
    targets = adapter_targets(arch, "all-linear")
    method = methods.get("qlora")

    def gemms(f):
        return steptime.gemm_shapes(arch, method, targets, 16, 4096, False, 2048, 256, f)

    even, skewed = gemms(1.0), gemms(3.0)
    uniform = round(4096 * 8 / 128)
    assert {s[0] for s in even} >= {uniform, 4096}
    # Each expert GEMM's token dimension (rows, or the inner one of a weight gradient) triples; nothing else moves.
    assert skewed == [(*(3 * x if x == uniform else x for x in s[:3]), s[3]) for s in even]
    assert max(s[0] for s in gemms(100.0)) == 4096  # an expert never gets more than every token


def test_routing_is_its_own_memory_bound_work():
    arch = from_registry("Qwen/Qwen3-30B-A3B")
    dense = replace(arch, moe=None)
    assert steptime.routing_bytes_per_token(dense, 2) == 0
    assert steptime.routing_bytes_per_token(arch, 2) == pytest.approx(
        arch.layers * (24 * 128 + 2 * arch.hidden * (2 + 2 * 8) + 32 * 8)
    )


def test_plan_answers_for_qwen3_moe_qlora_on_three_gpus_and_the_api_agrees(capsys):
    gpus = "rtx-4090,rtx-5090,h100-sxm"
    argv = ["plan", "--model", "Qwen/Qwen3-30B-A3B", "--method", "qlora", "--gpu", gpus, "--examples", "10000"]
    assert main([*argv, "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["gpu"] for x in lines] == gpus.split(",")
    arch = from_registry("Qwen/Qwen3-30B-A3B")
    for x in lines:
        assert x["examples"] == 10000 and x["train_s"] > 0
        assert x["fits"] == (x["peak_memory_bytes"] <= x["memory_capacity_bytes"])
        assert x["memory_breakdown"]["weights"] >= arch.total_params * 0.5  # every expert held, in nf4
        assert x["active_params"] < x["total_params"] / 5 and x["moe"]["imbalance"] == 1.0
    api = estimate(model="Qwen/Qwen3-30B-A3B", method="qlora", gpu=gpus.split(","), examples=10000)
    assert [r.single.time_s for r in api] == pytest.approx([x["time_s"] for x in lines])
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "3.353 B active per token" in table and "8 of 128 experts" in table and "uniform routing" in table


@pytest.mark.parametrize(
    "model, flag, message",
    [
        ("Qwen/Qwen3-30B-A3B", "0.5", "moe.imbalance must be at least 1"),
        ("llama-3.2-1b", "2", "moe.imbalance=2 applies to Mixture-of-Experts models; meta-llama/Llama-3.2-1B is dense"),
    ],
)
def test_bad_imbalance_is_one_line(model, flag, message, capsys):
    assert main(["plan", "--model", model, "--examples", "100", "--moe-imbalance", flag]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_a_config_whose_top_k_exceeds_its_experts_is_one_line_in_plan(tmp_path, capsys):
    model = tmp_path / "moe"
    config = hf_config("MixtralConfig", num_local_experts=4, num_experts_per_tok=2)
    config.save_pretrained(model)
    path = model / "config.json"
    path.write_text(path.read_text().replace('"num_experts_per_tok": 2', '"num_experts_per_tok": 6'))
    assert main(["plan", "--model", str(model), "--examples", "100"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "num_experts_per_tok=6" in err and "num_local_experts=4" in err


def test_bench_fit_prices_an_moe_row_with_its_measured_imbalance():
    """A measured MoE row (bench fit's rows) is observed like any other; on a GPU its imbalance raises the matmul
    part; on a CPU, whose experts run one product after another, it does not, and each product's call is priced at
    the row's product-call probe (`call_s`; the class's catalog figure without one)."""
    row = dict(
        device="cpu-avx512-bf16", kind="cpu", label="moe", source="test", model="random:olmoe-1b-7b-0924",
        method="lora", micro_batch=2, seq_len=256, compiled=False, grad_ckpt=False, measured_s=1.0, peak=2e12,
        bandwidth=2e10, r=8, compute_bytes=2, packing=True, lengths="mean:200", loss_fraction=0.5,
    )  # fmt: skip
    arch = random_arch("random:olmoe-1b-7b-0924")
    lengths = np.full(50, 200)
    gpu = {**row, "device": "h100-sxm", "kind": "cuda"}
    even, skewed = (fit_rows.observe(fit_rows.Row(**gpu, imbalance=f), arch, lengths) for f in (1.0, 2.0))
    assert skewed.observation.coefficients[0] + skewed.observation.coefficients[2] > (
        even.observation.coefficients[0] + even.observation.coefficients[2]
    )
    assert even.observation.fixed_s == 0  # a GPU's experts: one grouped kernel, no per-expert calls
    even, skewed = (fit_rows.observe(fit_rows.Row(**row, imbalance=f), arch, lengths) for f in (1.0, 2.0))
    assert skewed.observation.coefficients == even.observation.coefficients
    probed = fit_rows.observe(fit_rows.Row(**row, call_s=1e-4), arch, lengths).observation.fixed_s
    assert probed > 0 and even.observation.fixed_s == pytest.approx(
        probed * catalog.product_call_s("cpu-avx512-bf16", "cpu")[0] / 1e-4
    )
    assert fit_rows.check_row(fit_rows.Row(**row, imbalance=0.5)).startswith("imbalance must be at least 1")
    assert fit_rows.check_row(fit_rows.Row(**row, slot_products_len=0)).startswith("slot_products_len")


def test_random_moe_rows_build_their_family_config():
    """random:<an MoE row> builds the family's own transformers config with the catalog's shape."""
    from tunelab import sources

    for ref in ("random:qwen3-30b-a3b", "random:gpt-oss-20b"):
        source = sources.resolve(ref, weights=False)
        config = sources.random_config(source)
        assert families.moe_shape(config, ref) == from_registry(source.random_key).moe


def test_the_guide_lists_every_catalog_model():
    from pathlib import Path

    guide = (Path(__file__).parents[3] / "docs" / "guide.md").read_text()
    missing = [k for k in catalog.read("models.yaml")["models"] if f"`{k}`" not in guide]
    assert not missing


def test_lora_targets_name_modules_as_train_does():
    """`experts` is every expert projection, a leaf name every module of it (the experts' and a shared expert's);
    routers are never adapted, and `lora.router` adds them whole to what trains."""
    arch = from_hf_config(
        "m",
        hf_config("Qwen2MoeConfig", num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24),
        "config.json",
    )
    assert adapter_targets(arch, ["q_proj", "experts"]) == ("q_proj", "experts.gate_up_proj", "experts.down_proj")
    assert adapter_targets(arch, ["down_proj"]) == ("experts.down_proj", "shared_expert.down_proj")
    with pytest.raises(TunelabError, match="router not found in the model; .* \\(or experts for all"):
        adapter_targets(arch, ["router"])
    from tunelab.config import AdapterConfig, LoraConfig
    from tunelab.plan.job import Job

    lay = memory.Layout(compute_bytes=2, targets=("q_proj",), row_len=64, loss_rows=32)
    plain, routed = (Job(adapter=AdapterConfig(lora=LoraConfig(r=4, router=on))) for on in (False, True))
    routers = len(arch.moe.sparse_layers) * arch.hidden * arch.moe.experts
    assert memory.trainable_params(arch, routed, lay) - memory.trainable_params(arch, plain, lay) == routers
