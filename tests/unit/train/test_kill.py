"""kill -9 during a checkpoint write and during the final save (SFT), during generation and during the update
(GRPO), then resume: the same losses (and rewards) and weights as a run never killed, and no half-written file. benchmarks/scripts/faults.py runs the same check at 20 seeded moments."""

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
    assert sorted(s for s, _ in reference) == list(range(1, faults.STEPS + 1))

    torn = faults.run_kill(cfg, tmp_path, reference, weights, "torn", checkpoint_torn["n"], None, "checkpoint")
    # Killed with the first checkpoint's weights file half on disk: no checkpoint is visible, and the resumed
    # run starts over and still ends where the uninterrupted one did.
    assert torn["killed"] and torn["checkpoints_at_kill"] == [], torn
    assert torn["ok"], torn

    final = faults.run_kill(cfg, tmp_path, reference, weights, "rename-before", final_rename["n"], None, "final")
    assert final["killed"] and final["checkpoints_at_kill"], final
    assert final["ok"], final


def test_grpo_kill_9_during_generation_and_during_the_update_then_resume(tmp_path):
    faults = _faults()
    cfg = faults.make_run(tmp_path, "grpo")
    census = tmp_path / "census.json"
    assert faults.train(cfg, tmp_path / "reference", census=census) == 0
    events = json.loads(census.read_text())
    keys = faults.compared("grpo")
    reference = faults.losses(tmp_path / "reference", keys)
    weights = faults.adapter_weights(tmp_path / "reference")
    # The rewards differ within groups: a resumed run that sampled other completions would log other rewards.
    assert len({round(v, 6) for (s, k), v in reference.items() if k == "reward"}) > 1, reference
    # Past the first checkpoint (step 3), so the resumed run must restore the sampler's RNG to match.
    tokens_per_batch = len([e for e in events if e["event"] == "generate"]) // faults.STEPS
    generate = next(e for e in events if e["event"] == "generate" and e["n"] > 4 * tokens_per_batch + 2)
    update = next(e for e in events if e["event"] == "step" and e["n"] == 8)
    for kind, event in (("generate", generate), ("step", update)):
        res = faults.run_kill(cfg, tmp_path, reference, weights, kind, event["n"], None, kind, keys)
        assert res["killed"] and res["checkpoints_at_kill"], res
        assert res["ok"], res
