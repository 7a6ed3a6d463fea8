"""Per-GPU ceilings (catalog/gpus.yaml) and the step constants an unmeasured GPU gets from them."""

from __future__ import annotations

import pytest

from tunelab.plan import catalog


def test_every_published_ceiling_names_its_source():
    for gpu_id in catalog.gpu_ids():
        c = catalog.ceilings(gpu_id)
        if c.mamf_flops:
            assert c.mamf_source, gpu_id
            # a MAMF below a third of the datasheet peak would be a unit slip (TFLOPS vs FLOPS)
            assert c.mamf_flops > catalog.gpu(gpu_id).peak_flops / 3, gpu_id
        if c.attention_fraction:
            assert 0 < c.attention_fraction < 1 and c.attention_source, gpu_id


def test_unmeasured_gpu_scales_the_measured_gpus_share_of_their_ceiling():
    """The A100's matmul constant is the H200's achieved share of its MAMF times the A100's MAMF over its peak,
    and its attention the H200's constant times Ampere's kernel share over Hopper's: not a copy of the H200's."""
    h200 = catalog.step_constants("h200", "cuda")
    a100 = catalog.step_constants("a100-80gb", "cuda")
    hc, ac = catalog.ceilings("h200"), catalog.ceilings("a100-80gb")
    share = h200.matmul * catalog.gpu("h200").peak_flops / hc.mamf_flops
    assert a100.matmul == pytest.approx(share * ac.mamf_flops / catalog.gpu("a100-80gb").peak_flops)
    assert a100.attention == pytest.approx(h200.attention * ac.attention_fraction / hc.attention_fraction)
    assert a100.bandwidth == h200.bandwidth  # no published bandwidth ceiling: carried as it is
    assert set(a100.scaled) == {"matmul", "attention"}
    assert "published ceilings: matmul, attention" in a100.label
    # An RTX 4090 reaches nearly its whole FP32-accumulate peak in a matmul, an H200 about 80% of its peak.
    assert catalog.step_constants("rtx-4090", "cuda").matmul > h200.matmul * 1.15


def test_gpu_without_published_ceilings_keeps_the_pooled_constants():
    l4 = catalog.step_constants("l4", "cuda")  # no MAMF published; Ada's attention share is
    pooled = catalog.read("fitted.yaml")["kinds"]["cuda"]["constants"]
    assert l4.matmul == pytest.approx(float(pooled["matmul"]))
    assert l4.scaled == ("attention",)


def test_cpu_classes_are_not_scaled():
    assert catalog.step_constants("cpu-not-measured", "cpu").scaled == ()
    assert catalog.ceilings("cpu").mamf_flops == 0.0


def test_the_published_development_set_models_are_in_the_catalog():
    """benchmarks/scripts/published_dev.py predicts every case of ../shared/published-dev.yaml without weights."""
    from tunelab.plan import arch

    names = arch.registry_names()
    for model in ("Qwen/Qwen2.5-32B-Instruct", "meta-llama/Llama-3.3-70B-Instruct", "Qwen/Qwen2.5-7B"):
        assert model in names
