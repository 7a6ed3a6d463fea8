"""Nothing tunelab loads can run code: no unpickling in the source, no pickle in a checkpoint."""

import json
import pickle
import random
import re
import zipfile

import numpy as np
import torch
from conftest import REPO, tiny_optimizer_run
from safetensors.torch import load_file

from tunelab.train import checkpoint
from tunelab.train.checkpoint import TrainState

SRC = REPO / "src"


def test_no_source_file_unpickles():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            torch_load = "torch.load(" in line and "weights_only=True" not in line
            if "weights_only=False" in line or torch_load or re.search(r"\b(c?pickle|dill|joblib)\.load", line):
                offenders.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert not offenders


def test_a_checkpoint_holds_no_pickle_and_loads_with_pickle_refused(tmp_path, monkeypatch):
    model, optimizer, scheduler = tiny_optimizer_run()
    path = checkpoint.save(tmp_path, model, optimizer, scheduler, TrainState(step=2, tokens_loss=7), keep=2)
    draws = torch.rand(3), random.random(), np.random.random()  # what the saved RNG states produce next

    for file in path.iterdir():
        assert not zipfile.is_zipfile(file)  # what torch.save writes: a zip of pickles
        if file.suffix == ".json":
            json.loads(file.read_text())
        else:
            assert file.suffix == ".safetensors"
            load_file(file)

    def refuse(*args, **kwargs):
        raise AssertionError("loading a checkpoint unpickled")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    fresh_model, fresh_optimizer, fresh_scheduler = tiny_optimizer_run(steps=0, seed=1)
    state = checkpoint.load(path, fresh_model, fresh_optimizer, fresh_scheduler)

    after = torch.rand(3), random.random(), np.random.random()

    assert state == TrainState(step=2, tokens_loss=7)
    assert torch.equal(after[0], draws[0]) and after[1:] == draws[1:]
    assert all(torch.equal(a, b) for a, b in zip(fresh_model.parameters(), model.parameters()))
    assert_same(fresh_optimizer.state_dict(), optimizer.state_dict())
    assert_same(fresh_scheduler.state_dict(), scheduler.state_dict())


def assert_same(got, expected, where="state"):
    """Equal nested state, tensors compared exactly and with their dtype."""
    assert type(got) is type(expected), where
    if isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype and torch.equal(got, expected), where
    elif isinstance(expected, dict):
        assert got.keys() == expected.keys(), where
        for key in expected:
            assert_same(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), where
        for i, (a, b) in enumerate(zip(got, expected)):
            assert_same(a, b, f"{where}.{i}")
    else:
        assert got == expected, where
