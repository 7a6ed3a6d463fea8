"""kill -9 during a checkpoint write and during the final save, then resume: the same losses and weights as a
run never killed, and no half-written file. benchmarks/scripts/faults.py runs the same check at 20 seeded moments."""

import importlib.util
import json

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow


def _faults():
    spec = importlib.util.spec_from_file_location("faults", REPO / "benchmarks" / "scripts" / "faults.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kill_9_in_a_checkpoint_write_and_in_the_final_save_then_resume(tmp_path):
    faults = _faults()
    cfg = faults.make_run(tmp_path)
    census = tmp_path / "census.json"
    assert faults.train(cfg, tmp_path / "reference", census=census) == 0
    events = json.loads(census.read_text())
    checkpoint_torn = next(e for e in events if e["event"] == "torn" and e["phase"] == "checkpoint")
    final_rename = next(e for e in events if e["event"] == "rename" and e["phase"] == "final")
    reference = faults.losses(tmp_path / "reference")
    weights = faults.adapter_weights(tmp_path / "reference")
    assert sorted(reference) == list(range(1, faults.STEPS + 1))

    torn = faults.run_kill(cfg, tmp_path, reference, weights, "torn", checkpoint_torn["n"], None, "checkpoint")
    # Killed with the first checkpoint's weights file half on disk: no checkpoint is visible, and the resumed
    # run starts over and still ends where the uninterrupted one did.
    assert torn["killed"] and torn["checkpoints_at_kill"] == [], torn
    assert torn["ok"], torn

    final = faults.run_kill(cfg, tmp_path, reference, weights, "rename-before", final_rename["n"], None, "final")
    assert final["killed"] and final["checkpoints_at_kill"], final
    assert final["ok"], final
