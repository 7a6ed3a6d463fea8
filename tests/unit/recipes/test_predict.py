"""plan's view of the present machine (`plan --gpu local`, the demo's budget, bench's prediction column)."""

import pytest
import torch

from tunelab import device as devmod
from tunelab import probe
from tunelab.plan import calibration
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
    monkeypatch.setattr(calibration, "calibration_dir", lambda: tmp_path)  # no calibration record
    probed = []
    monkeypatch.setattr(probe, "matmul_peak", lambda d, dev: probed.append(d) or (1e11, 256))
    local = local_device(precision)
    assert local.gpu.device_class == cls
    assert local.gpu.bf16 == (dtype == torch.bfloat16)
    assert probed == [dtype] and local.gpu.peak_flops == 1e11
