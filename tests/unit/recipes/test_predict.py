"""plan's view of the present machine (`plan --gpu local`, the demo's budget, bench's prediction column)."""

import numpy as np
import pytest
import torch

from tunelab import device as devmod
from tunelab import probe
from tunelab.plan import calibration, catalog
from tunelab.recipes.predict import local_device


@pytest.mark.parametrize(
    ("cpu", "precision", "cls", "dtype"),
    [
        ("avx512-bf16", "auto", "cpu-avx512-bf16", torch.bfloat16),
        ("amx", "auto", "cpu", torch.bfloat16),
        ("fp32-only", "auto", "cpu-fp32", torch.float32),
        ("avx512-bf16", "fp32", "cpu-fp32", torch.float32),
    ],
)
def test_local_cpu_class_follows_the_matmul_units(monkeypatch, tmp_path, cpu, precision, cls, dtype):
    monkeypatch.setattr(devmod, "cpu_class", lambda: cpu)
    monkeypatch.setattr(devmod, "cpu_vendor", lambda: "")  # a CPU whose vendor is unknown: the class over all vendors
    monkeypatch.setattr(calibration, "calibration_dir", lambda: tmp_path)  # no calibration record
    probed = []
    monkeypatch.setattr(probe, "matmul_peak", lambda d, dev: probed.append(d) or (1e11, 256))
    local = local_device(precision)
    assert local.gpu.device_class == cls
    assert local.gpu.bf16 == (dtype == torch.bfloat16)
    assert probed == [dtype] and local.gpu.peak_flops == 1e11


@pytest.mark.parametrize(
    ("name", "catalog_id"), [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA Z9000", "")]
)
def test_a_local_cuda_gpu_plans_with_its_catalog_row(monkeypatch, tmp_path, name, catalog_id):
    """On a CUDA device `plan --gpu local` (and bench's plan column) takes the matched catalog row's bandwidth and
    fitted step constants; an unlisted GPU the pooled constants and the nearest peak's bandwidth. The local
    device once had bandwidth 0 here, and every plan on a GPU divided by it."""
    from tunelab.config import load_config
    from tunelab.plan.estimate import Job, estimate
    from tunelab.plan.workload import Lengths
    from tunelab.sources import resolve_arch

    monkeypatch.setattr(devmod, "pick_device", lambda ref: torch.device("cuda"))
    monkeypatch.setattr(devmod, "pick_precision", lambda p, d: devmod.Precision("bf16"))
    monkeypatch.setattr(devmod, "device_name", lambda d: name)
    monkeypatch.setattr(devmod, "device_memory_bytes", lambda d: 140 * 2**30)
    monkeypatch.setattr(calibration, "calibration_dir", lambda: tmp_path)
    monkeypatch.setattr(probe, "matmul_peak", lambda d, dev: (7.9e14, 8192))
    local = local_device("auto")
    assert local.gpu.catalog_id == catalog_id and local.gpu.device_type == "cuda"
    # a listed GPU plans at its datasheet peak, of which the fitted constants are fractions; others probe
    assert local.gpu.peak_flops == (catalog.gpu(catalog_id).peak_flops if catalog_id else 7.9e14)
    cfg = load_config(None, ["model=random:llama-3.2-1b", "method=lora", "seq_len=2048", "micro_batch=8"])
    arch = resolve_arch(cfg.model)
    lengths = Lengths(2000, 600.0, 300.0, "test", np.full(2000, 600))
    est = estimate(arch, lengths, Job.of(cfg), local)
    assert est.step.total > 0 and est.time_s > 0
    label = est.efficiency.label
    assert f"constants for {catalog_id}:" in label if catalog_id else "constants for class probe-gpu: carried" in label
