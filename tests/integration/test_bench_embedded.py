"""Calibration closes the loop on the embedded SmolLM2-135M: `bench --calibrate`, then plan's predicted
training time for a run of another length against that run's measured training time."""

import random

import pytest

from conftest import write_jsonl
from tunelab.cli import main
from tunelab.config import load_config
from tunelab.plan.command import local_prediction
from tunelab.train.command import train

pytestmark = pytest.mark.integration

# Small rows keep a step near a second on a quiet 2-core CPU; the shape is the same for calibration and run.
SHAPE = ["method=lora", "seq_len=128", "micro_batch=2", "precision=auto", "data.template=compact"]
# The target of issue 5 is 10%. What moves the ratio: the calibration window is steady-state only while the
# checked run's train_s also holds its 2 warm-up steps (first-step allocation, oneDNN primitive creation),
# a few percent of a 30-step run; and the CPU is shared, so throughput drifts between the two runs. On a
# quiet machine the two together stay under 10%; on a loaded one (load average > 2 on 2 cores) they do not,
# and this test says so by failing rather than by a wider band.
TOLERANCE = 0.10


@pytest.fixture
def data(tmp_path):
    r = random.Random(0)
    rows = [{"instruction": f"{a} + {b}", "output": f"{a} + {b} = {a + b}"}
            for a, b in ((r.randint(0, 10**8), r.randint(0, 10**8)) for _ in range(400))]
    return write_jsonl(tmp_path / "add.jsonl", rows)


def test_calibrated_plan_predicts_training_time(data, tmp_path, monkeypatch):
    common = [f"data.path={data}", *SHAPE]
    monkeypatch.setenv("TUNELAB_CACHE", str(_cache_with_model(tmp_path)))
    # 12 measured steps: with 4, one slow window on an idle machine made the prediction 10.5% long.
    assert main(["bench", "--calibrate", *common, f"output_dir={tmp_path / 'cal'}", "--methods", "lora",
                 "--steps", "12"]) == 0
    # 60 != 2 + 12. Long enough that the run's two cold first steps (not in plan's model, and measured at
    # ~2.4 s extra in a fresh CI process) stay a small part of it: with 12 steps they made it 19% slower,
    # and with 30 steps, once the fused LoRA layer made steps ~0.65 s, 12% slower.
    cfg = load_config(None, [*common, "max_steps=60", f"output_dir={tmp_path / 'run'}"])
    predicted = local_prediction(cfg).speed.train_s
    summary = train(cfg, show_progress=False)
    print(f"predicted train {predicted:.1f} s, measured {summary['train_s']:.1f} s")
    assert predicted == pytest.approx(summary["train_s"], rel=TOLERANCE)


def _cache_with_model(tmp_path):
    """A fresh calibration directory, with the embedded model's converted copy linked in so it is not rebuilt."""
    from tunelab.model.load import cache_dir

    real = cache_dir()
    cache = tmp_path / "cache"
    cache.mkdir()
    for entry in real.iterdir() if real.is_dir() else []:
        if entry.name != "calibration":
            (cache / entry.name).symlink_to(entry)
    return cache
