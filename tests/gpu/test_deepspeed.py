"""DeepSpeed ZeRO-2 and ZeRO-3 through `tunelab train --nproc 1 --accelerate-config zeroN.yaml` on one GPU: the
same losses as a plain run of the same config, and a saved model that loads. Accelerate runs DeepSpeed on GPUs
only, so this is the one place the ZeRO paths run (tests/unit/train/test_accelerate_configs.py checks on CPU what
tunelab hands DeepSpeed). Skipped without CUDA or DeepSpeed (benchmarks/gpu_prepare.sh builds its wheel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, small_run_config

pytestmark = pytest.mark.gpu


def _losses(out: Path) -> dict[str, float]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {f"{k}@{m['step']}": m[k] for m in lines for k in ("loss", "eval_loss") if k in m}


@pytest.mark.parametrize("stage", ["zero2", "zero3"])
@pytest.mark.parametrize("method", ["lora", "full"])
def test_zero_runs_as_a_plain_run_and_saves(tiny_model_dir, tmp_path, stage, method):
    pytest.importorskip("deepspeed")
    config = small_run_config(tmp_path, tiny_model_dir, "max_steps: 4\ndevice: cuda\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    runs = {}
    for name, launch in [
        ("plain", []),
        (stage, ["--nproc", "1", "--accelerate-config", f"configs/accelerate/{stage}.yaml"]),
    ]:
        out = tmp_path / name
        cmd = [sys.executable, "-m", "tunelab.cli", "train", "--config", str(config), *launch, "--quiet"]
        done = subprocess.run(
            [*cmd, f"method={method}", f"output_dir={out}"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = out
    plain, zero = _losses(runs["plain"]), _losses(runs[stage])
    assert plain.keys() == zero.keys()
    for k in plain:  # fp32 on one process: DeepSpeed's flattened fp32 copies and its clipping reorder sums only
        assert zero[k] == pytest.approx(plain[k], rel=1e-4), k
    saved = runs[stage] / ("model" if method == "full" else "adapter")
    assert (saved / ("model.safetensors" if method == "full" else "adapter_model.safetensors")).stat().st_size > 0
