"""Calibration closes the loop on the embedded SmolLM2-135M: `bench --calibrate`, then plan reads the record."""

import json
import random

import pytest
from conftest import write_jsonl

from tunelab.cli import main
from tunelab.config import load_config
from tunelab.recipes.predict import local_prediction

pytestmark = pytest.mark.integration

# Small rows keep a step near a second on a quiet 2-core CPU.
SHAPE = ["method=lora", "seq_len=128", "micro_batch=2", "precision=auto", "data.template=compact"]


@pytest.fixture
def data(tmp_path):
    r = random.Random(0)
    rows = [
        {"instruction": f"{a} + {b}", "output": f"{a} + {b} = {a + b}"}
        for a, b in ((r.randint(0, 10**8), r.randint(0, 10**8)) for _ in range(400))
    ]
    return write_jsonl(tmp_path / "add.jsonl", rows)


def test_calibration_makes_plan_predict_the_measured_rate(data, tmp_path, monkeypatch, capsys):
    """`bench --calibrate` then `plan --gpu local`: plan's optimizer step for the calibrated config is the step the
    calibration run measured, and its label says where the efficiency came from. How close a calibrated plan
    comes to a run of another length is a wall-clock figure, measured by benchmarks/scripts/calibration.py."""
    common = [f"data.path={data}", *SHAPE]
    monkeypatch.setenv("TUNELAB_CACHE", str(_cache_with_model(tmp_path)))
    capsys.readouterr()
    assert (
        main(
            [
                "bench",
                "--calibrate",
                *common,
                f"output_dir={tmp_path / 'cal'}",
                "--methods",
                "lora",
                "--steps",
                "4",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    measured = out["runs"][0]["step_time_median_s"]
    prediction = local_prediction(load_config(None, [*common, "max_steps=60", f"output_dir={tmp_path / 'run'}"]))
    assert "calibrated for lora" in prediction.efficiency.label
    assert prediction.step.total == pytest.approx(measured, rel=1e-6)
    assert prediction.device.gpu.peak_flops == out["calibration"]["peak_flops"]


def _cache_with_model(tmp_path):
    """A fresh calibration directory, with the embedded model's converted copy linked in so it is not rebuilt."""
    from tunelab.io import tunelab_cache

    real = tunelab_cache()
    cache = tmp_path / "cache"
    cache.mkdir()
    for entry in real.iterdir() if real.is_dir() else []:
        if entry.name != "calibration":
            (cache / entry.name).symlink_to(entry)
    return cache
