"""An MoE model's experts on a CPU in plan's step model: one product per expert reached, each paying the device's
measured call cost (probe.product_call_s, catalog/calls.yaml), their sum at the uniform share whatever the routing's
skew, and LoRA's tiles (their padding rows and index traffic) on tunelab's path (plan/steptime.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tunelab import methods, probe
from tunelab.plan import catalog, fit, steptime
from tunelab.plan.arch import adapter_targets, from_registry
from tunelab.plan.steptime import Constants, Shape

LORA, FULL = methods.get("lora"), methods.get("full")
ASSUMED = fit.ASSUMED["cpu"]
C = Constants(matmul=1.0, attention=0.3, bandwidth=0.6, launch_s=2e-5)


def moe_arch(experts: int, top_k: int, width: int = 256):
    """Qwen3-30B-A3B's row cut to 2 layers of hidden 256, `experts` experts of `width`, `top_k` a token."""
    arch = from_registry("Qwen/Qwen3-30B-A3B")
    moe = replace(arch.moe, experts=experts, top_k=top_k, expert_width=width, sparse_layers=(0, 1))
    return replace(arch, hidden=256, layers=2, heads=8, kv_heads=4, head_dim=32, vocab=8192, moe=moe)


def step_s(arch, cpu: bool, imbalance: float = 1.0, call_s: float = 3.4e-5, method=LORA, tokens: int = 1024) -> float:
    shape = Shape(1, tokens, 256.0, False, 2, tokens - 4, imbalance=imbalance, expert_segments=cpu)
    targets = adapter_targets(arch, "all-linear") if not method.trains_base else ()
    w = steptime.work(arch, method, "none", targets, 16, False, shape, ridge=8.0)
    return steptime.breakdown(w, 400e9, 40e9, C, call_s).total


def test_experts_hit_under_uniform_routing():
    assert steptime.experts_hit(64, 8, 1) == pytest.approx(8)  # one token reaches its top_k
    assert steptime.experts_hit(64, 8, 1024) == pytest.approx(64)  # a micro-batch reaches every expert
    assert steptime.experts_hit(64, 8, 4) == pytest.approx(64 * (1 - (56 / 64) ** 4))


def test_each_expert_reached_runs_each_projection_per_pass():
    arch = moe_arch(64, 8)
    hit = steptime.experts_hit(64, 8, 1024)
    # 2 sparse layers x 2 stacked projections (gate_up, down) x (forward + input gradient)
    assert steptime.expert_product_calls(arch, LORA, False, 1024) == pytest.approx(2 * hit * 2 * 2)
    assert steptime.expert_product_calls(arch, LORA, True, 1024) == pytest.approx(2 * hit * 2 * 3)  # recomputed
    assert steptime.expert_product_calls(arch, FULL, False, 1024) == pytest.approx(2 * hit * 2 * 3)  # + dW
    assert steptime.expert_product_calls(replace(arch, moe=None), LORA, False, 1024) == 0


def test_the_calls_are_counted_on_a_cpu_only_and_priced_at_call_s():
    arch = moe_arch(64, 8)
    shape = Shape(1, 1024, 256.0, False, 2, 1020, expert_segments=True)
    targets = adapter_targets(arch, "all-linear")
    cpu = steptime.work(arch, LORA, "none", targets, 16, False, shape, ridge=8.0)
    gpu = steptime.work(arch, LORA, "none", targets, 16, False, replace(shape, expert_segments=False), ridge=8.0)
    assert cpu.calls == pytest.approx(steptime.expert_product_calls(arch, LORA, False, 1024)) and gpu.calls == 0
    without = steptime.breakdown(cpu, 400e9, 40e9, C, 0.0)
    assert steptime.breakdown(cpu, 400e9, 40e9, C, 3e-5).fixed_s - without.fixed_s == pytest.approx(cpu.calls * 3e-5)


def test_more_experts_at_the_same_active_flops_is_slower_on_a_cpu():
    # 64 experts of 256, 8 a token, against 8 experts of 256, 1 a token... at equal active width: top_k x width
    many, few = moe_arch(64, 8, 256), moe_arch(8, 1, 2048)

    def active_experts(a):
        return sum(m.active * m.d_in * m.d_out for m in a.modules() if m.group == "expert")

    assert active_experts(many) == pytest.approx(active_experts(few))
    assert step_s(many, cpu=True) > 1.2 * step_s(few, cpu=True)
    assert step_s(many, cpu=True, call_s=0) < step_s(many, cpu=True)  # the calls are a part of it


def test_the_routing_skew_does_not_price_the_cpu_experts_but_does_a_gpu():
    arch = moe_arch(64, 8)
    assert step_s(arch, cpu=True, imbalance=3.0) == pytest.approx(step_s(arch, cpu=True))
    assert step_s(arch, cpu=False, imbalance=3.0) > step_s(arch, cpu=False)


def test_lora_tiles_pad_the_experts_rows_and_move_bytes():
    arch = moe_arch(64, 8)
    tile = steptime.expert_tile(arch, 1024)
    assert tile == 32  # half the mean load (1024 x 8 / 64 = 128 rows) is 64, capped at 32
    assert steptime.expert_tile(moe_arch(64, 8), 64) == 16  # 4 rows half a mean load: the smallest tile
    assert steptime.tile_padding(arch, 1024) == pytest.approx(64 * tile / 2 / 64)
    experts = adapter_targets(arch, "all-linear")
    assert steptime.tile_bytes(arch, experts, 16, 1024, 2) > 0
    assert steptime.tile_bytes(arch, adapter_targets(arch, "attn"), 16, 1024, 2) == 0
    rows = 1024 * 8
    # the in-place accumulation reads every row's output and input gradient at least, in both sparse layers;
    # the copies into and out of tiles (7 d_in + 4 d_out a row, the layout before) are gone
    inplace = [rows * (i + o) for i, o in ((256, 512), (256, 256))]
    copies = [rows * (7 * i + 4 * o) for i, o in ((256, 512), (256, 256))]
    assert 2 * 2 * sum(inplace) < steptime.tile_bytes(arch, experts, 16, 1024, 2) < 2 * 2 * sum(copies)


def test_the_catalog_call_cost_per_class():
    own, source = catalog.product_call_s("cpu-avx512-bf16", "cpu")
    assert own > 0 and source.startswith("benchmarks/plan-accuracy/")
    other, why = catalog.product_call_s("cpu-something-new", "cpu")
    assert other > 0 and "no row" in why
    assert catalog.product_call_s("h100-sxm", "cuda") == (0.0, "")


def test_the_measured_calls_are_added_to_a_prediction_and_left_out_of_the_fit():
    c = Constants(matmul=0.8, attention=0.3, bandwidth=1.0, launch_s=2e-5)
    coefficients = (0.5, 0.1, 0.2, 1000.0)
    plain = fit.predict_s(c, coefficients)
    assert fit.predict_s(c, coefficients, 0.05) == pytest.approx(plain + 0.05)
    # rows whose measured step holds a known 0.05 s of calls fit the same constants as rows without it
    rows = [(0.5, 0.1, 0.2, 1000.0), (0.2, 0.3, 0.1, 500.0), (1.0, 0.1, 0.6, 200.0), (0.3, 0.5, 0.3, 3000.0)]
    obs = [fit.Observation("d", "cpu", str(i), "s", k, fit.predict_s(c, k)) for i, k in enumerate(rows)]
    more = [replace(o, measured_s=o.measured_s + 0.05, fixed_s=0.05) for o in obs]
    solved = fit.to_x(fit.solve(more, ASSUMED, weight=1e-9))
    assert solved == pytest.approx(fit.to_x(c), rel=1e-4)
    # and with the calls left unpriced, the same rows fit other constants
    unpriced = [replace(o, fixed_s=0.0) for o in more]
    assert fit.to_x(fit.solve(unpriced, ASSUMED, weight=1e-9)) != pytest.approx(fit.to_x(c), rel=1e-2)


def test_the_product_call_probe_is_quick_and_positive():
    import time

    import torch

    start = time.perf_counter()
    call = probe.measure_product_call_s(torch.float32, torch.device("cpu"), products=8)
    assert call >= 0 and time.perf_counter() - start < 1.0


def test_plan_local_on_a_cpu_prices_the_experts_calls_at_its_own_probe(monkeypatch, capsys):
    """`plan --gpu local` on a CPU takes the product-call probe beside the copy probe: a slower call, a slower
    MoE step (random:qwen3-30b-a3b's 128 experts: thousands of per-expert products a step)."""
    import json

    from tunelab.cli import main

    monkeypatch.setattr("tunelab.plan.calibration.load_calibration", lambda key: None)
    monkeypatch.setattr("tunelab.probe.matmul_peak", lambda dtype, dev: (4e11, 2048))
    monkeypatch.setattr("tunelab.probe.copy_bandwidth", lambda dev: 3e10)
    args = ["plan", "--model", "random:qwen3-30b-a3b", "--examples", "10", "--gpu", "local", "--seq-len", "128"]
    args += ["--micro-batch", "1", "--json"]
    steps = []
    for call in (1e-5, 1e-3):
        monkeypatch.setattr("tunelab.probe.product_call_s", lambda dtype, dev, call=call: call)
        assert main(args) == 0
        steps.append(json.loads(capsys.readouterr().out)["step_s"]["fixed_s"])
    arch = from_registry("Qwen/Qwen3-30B-A3B")
    calls = steptime.expert_product_calls(arch, LORA, False, 128)
    assert steps[1] - steps[0] == pytest.approx(calls * (1e-3 - 1e-5), rel=0.02)


@pytest.mark.parametrize("experts,top_k", [(64, 8), (32, 4), (8, 2)])
def test_plans_lora_tile_is_the_one_the_experts_path_cuts(experts, top_k):
    """plan prices the tile model/moe.Segments cuts (its TILE_MIN/TILE_MAX rule, written again in plan, which
    imports no torch): the two must agree at every load."""
    import torch

    from tunelab.model import moe

    arch = moe_arch(experts, top_k)
    for tokens in (16, 64, 256, 1024, 4096):
        flat = torch.arange(tokens * top_k) % experts  # uniform routing: each expert's share of the rows
        ids = flat.sort().values
        segments = moe.Segments(ids, torch.bincount(flat, minlength=experts), experts)
        assert steptime.expert_tile(arch, tokens) == segments.tile, tokens
