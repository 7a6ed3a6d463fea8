"""The MAMF sweep (probe.measure_mamf): the best mean rate over GEMM shapes, and the shape that reached it."""

from __future__ import annotations

import torch

from tunelab import probe


def test_mamf_is_the_best_shape_of_the_sweep():
    shapes = [(64, 64, 64), (128, 256, 128)]
    flops, shape = probe.measure_mamf(torch.float32, torch.device("cpu"), shapes=shapes, iterations=3, warmup=1)
    assert shape in shapes and flops > 1e6  # any CPU multiplies these faster than 1 MFLOP/s


def test_the_default_sweep_spans_training_shapes_in_multiples_of_256():
    shapes = probe.mamf_shapes()
    assert len(shapes) == len(probe.MAMF_M) * len(probe.MAMF_NK) ** 2
    assert all(x % 256 == 0 for s in shapes for x in s)
    assert (4096, 14336, 4096) in shapes  # an 8B Llama's MLP up-projection at 4,096 tokens


def test_mamf_is_probed_once_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(probe, "measure_mamf", lambda dtype, device: calls.append(1) or (1e12, (1024, 2048, 2048)))
    monkeypatch.setattr(probe, "_mamf_cache", {})
    dev = torch.device("cpu")
    assert probe.mamf(torch.bfloat16, dev) == probe.mamf(torch.bfloat16, dev) == (1e12, (1024, 2048, 2048))
    assert len(calls) == 1
    probe.mamf(torch.bfloat16, dev, fresh=True)
    assert len(calls) == 2
