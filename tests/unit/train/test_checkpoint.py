"""Checkpoints: every file in the manifest, damaged ones skipped on resume, a full disk leaves the last one intact."""

import errno
import json
import os
import re

import pytest
import torch
from conftest import tiny_optimizer_run

from tunelab.errors import TunelabError
from tunelab.train import checkpoint
from tunelab.train.checkpoint import TrainState


@pytest.fixture
def two_checkpoints(tmp_path):
    model, optimizer, scheduler = tiny_optimizer_run()
    folder = tmp_path / "checkpoints"
    paths = [checkpoint.save(folder, model, optimizer, scheduler, TrainState(step=s), keep=2) for s in (2, 4)]
    return folder, paths


def test_the_manifest_lists_every_file_with_size_and_sha256(two_checkpoints):
    _, (_, path) = two_checkpoints
    files = json.loads((path / checkpoint.MANIFEST).read_text())["files"]
    assert set(files) == {p.name for p in path.iterdir()} - {checkpoint.MANIFEST}
    assert all(files[name]["bytes"] == (path / name).stat().st_size for name in files)
    assert checkpoint.verify(path) is None


def truncate(path):
    file = path / checkpoint.WEIGHTS
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def flip_a_byte(path):
    file = path / checkpoint.RESUME_TENSORS
    data = bytearray(file.read_bytes())
    data[-1] ^= 0xFF
    file.write_bytes(bytes(data))


def drop_manifest(path):
    (path / checkpoint.MANIFEST).unlink()


@pytest.mark.parametrize(
    "damage, reason",
    [
        (truncate, "trainable.safetensors has 140 bytes, the manifest says 280"),
        (flip_a_byte, "resume.safetensors does not match its sha256"),
        (drop_manifest, "no manifest.json"),
    ],
    ids=["truncated", "flipped-byte", "no-manifest"],
)
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous(two_checkpoints, capsys, damage, reason):
    folder, (previous, latest) = two_checkpoints
    damage(latest)
    assert checkpoint.find(folder, True) == previous
    err = capsys.readouterr().err
    assert err == f"checkpoint {latest} is incomplete or corrupt ({reason}); resuming from {previous}\n"


def test_no_valid_checkpoint_is_one_line_error(two_checkpoints):
    folder, paths = two_checkpoints
    for path in paths:
        drop_manifest(path)
    with pytest.raises(
        TunelabError,
        match=r"^resume: no valid checkpoint in .*checkpoints \(newest step-0000004: "
        r"no manifest.json\); set resume: false to start over$",
    ):
        checkpoint.find(folder, True)


def test_a_damaged_checkpoint_named_by_path_is_refused(two_checkpoints):
    _, (_, latest) = two_checkpoints
    truncate(latest)
    with pytest.raises(TunelabError, match="is incomplete or corrupt"):
        checkpoint.find(latest.parent, str(latest))


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_a_failed_save_leaves_the_previous_checkpoint_and_names_the_bytes(tmp_path, monkeypatch, code):
    model, optimizer, scheduler = tiny_optimizer_run()
    folder = tmp_path / "checkpoints"
    previous = checkpoint.save(folder, model, optimizer, scheduler, TrainState(step=2), keep=2)
    before = {p.name: p.read_bytes() for p in previous.iterdir()}

    def disk_fails(tensors, filename, *args, **kwargs):
        with open(filename, "wb") as f:
            f.write(b"half a file")
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(checkpoint, "save_file", disk_fails)
    with pytest.raises(TunelabError) as failure:
        checkpoint.save(folder, model, optimizer, scheduler, TrainState(step=4), keep=2)

    message = str(failure.value)
    # weights, both Adam moments, a step counter per tensor, and the torch RNG state
    needed = sum(3 * p.nbytes + 4 for p in model.parameters()) + torch.get_rng_state().nbytes
    assert "\n" not in message and os.strerror(code) in message
    assert re.search(rf"needs {needed:,} bytes, [\d,]+ bytes free there", message)
    assert [p.name for p in folder.iterdir()] == [previous.name]  # no step-4, no temp dir
    assert {p.name: p.read_bytes() for p in previous.iterdir()} == before
    assert checkpoint.find(folder, True) == previous


def test_a_checkpoint_is_refused_under_other_weight_settings_before_the_model_loads(tmp_path):
    model, optimizer, scheduler = tiny_optimizer_run()
    identity = {"model": "m", "method": "lora", "lora.r": 4}
    path = checkpoint.save(tmp_path, model, optimizer, scheduler, TrainState(step=2), keep=2, identity=identity)
    assert "identity.json" in json.loads((path / "manifest.json").read_text())["files"]
    checkpoint.check_identity(path, dict(identity))
    with pytest.raises(TunelabError, match=r"made with lora.r: 4, this config has lora.r: 8; set lora.r back"):
        checkpoint.check_identity(path, {**identity, "lora.r": 8})


def test_a_checkpoint_without_identity_of_another_shape_fails_naming_the_tensor(tmp_path):
    model, optimizer, scheduler = tiny_optimizer_run()
    path = checkpoint.save(tmp_path, model, optimizer, scheduler, TrainState(step=2), keep=2)
    checkpoint.check_identity(path, {"lora.r": 8})  # nothing recorded: left to the shape check
    with pytest.raises(
        TunelabError, match=r"holds bias of shape \[4\], this model.s is \[5\] \(another model or lora.r\)"
    ):
        checkpoint.load_weights(path, torch.nn.Linear(8, 5))
