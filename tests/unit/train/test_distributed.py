"""Data-parallel training on 2 gloo processes through the real CLI (`tunelab train --nproc 2`, accelerate launch).

Tolerance: the runs are fp32 and see the same tokens per step; what differs is summation order (each rank sums
its share, then the all-reduce adds the shares; DDP averages gradients and the loss is scaled back by the world
size). Reordered fp32 sums of ~1k loss tokens differ by a few ulps (~1e-7 relative), and four AdamW steps
carry that into the weights; 1e-5 relative leaves room for that and fails at any change of which tokens a step
trains or how they are normalised (each of which moves the loss by >1e-3 here). Weights get an absolute
tolerance of 1e-5 besides (1e-3 of one step's lr): AdamW divides each gradient by its running RMS, so an element
whose gradient is rounding noise moves by a noisy fraction of lr (measured: 3e-6 on one of 1024 elements).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, small_run_config
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

REL = 1e-5
ATOL = 1e-5
STEPS = 4
# Ranks are CPU processes sharing the machine's cores: one thread each keeps them from oversubscribing it.
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    """A config file over the tiny model and 64 addition rows (a held-out split of 10%, evaluated every 2 steps)."""
    tmp = tmp_path_factory.mktemp("dist")
    config = small_run_config(tmp, tiny_model_dir, f"max_steps: {STEPS}\nsave_steps: 2\n")
    return tmp, config


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tunelab.cli", "train", *args],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def _metrics(out: Path) -> tuple[dict[int, float], dict[int, float], list[int]]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = {m["step"]: m["loss"] for m in lines if "loss" in m}
    evals = {m["step"]: m["eval_loss"] for m in lines if "eval_loss" in m}
    return train, evals, [m["step"] for m in lines if "loss" in m]


def _close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == pytest.approx(b[k], rel=REL), k


@pytest.fixture(scope="module")
def two_procs(setup):
    tmp, config = setup
    out = tmp / "two"
    done = _cli("--config", str(config), "--nproc", "2", "--quiet", f"output_dir={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done


def test_two_processes_train_what_one_process_of_twice_the_micro_batch_trains(setup, two_procs):
    from tunelab.config import load_config
    from tunelab.recipes.finetune import finetune

    tmp, config = setup
    out2, _ = two_procs
    out1 = tmp / "one"
    summary = finetune(load_config(config, [f"output_dir={out1}", "micro_batch=8"]), show_progress=False)
    assert summary["world_size"] == 1
    assert json.loads((out2 / "summary.json").read_text())["world_size"] == 2
    train1, eval1, _ = _metrics(out1)
    train2, eval2, _ = _metrics(out2)
    assert sorted(train2) == list(range(1, STEPS + 1)) and sorted(eval2) == [2, 4]
    _close(train2, train1)
    _close(eval2, eval1)
    w1, w2 = (
        load_file(out1 / "adapter" / "adapter_model.safetensors"),
        load_file(out2 / "adapter" / "adapter_model.safetensors"),
    )
    assert w1.keys() == w2.keys()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=REL, atol=ATOL)


def test_only_the_main_process_writes(two_procs):
    out, done = two_procs
    assert {p.name for p in out.iterdir()} == {
        ".tunelab.lock",
        "adapter",
        "best",
        "checkpoints",
        "config.yaml",
        "metrics.jsonl",
        "summary.json",
    }
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-0000002"]
    _, _, logged = _metrics(out)
    assert logged == list(range(1, STEPS + 1))  # one line per log step: a second writer would double them
    assert len([line for line in done.stdout.splitlines() if line.startswith("{")]) == 1


def test_resume_on_two_processes_reproduces_the_uninterrupted_run(setup, two_procs):
    tmp, config = setup
    full, _ = two_procs
    out = tmp / "resumed"
    # The run as a kill after the step-2 checkpoint leaves it: later metrics lines, no final weights.
    out.mkdir()
    shutil.copytree(full / "checkpoints", out / "checkpoints")
    lines = (full / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    done = _cli("--config", str(config), "--nproc", "2", "--quiet", f"output_dir={out}", "resume=true")
    assert done.returncode == 0, done.stderr[-3000:]
    train_full, eval_full, _ = _metrics(full)
    train_res, eval_res, logged = _metrics(out)
    assert logged == list(range(1, STEPS + 1))
    _close(train_res, train_full)
    _close(eval_res, eval_full)
    a, b = (
        load_file(full / "adapter" / "adapter_model.safetensors"),
        load_file(out / "adapter" / "adapter_model.safetensors"),
    )
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=REL, atol=ATOL)


# `tunelab train` whose third forward (step 2's first micro-batch, after step 1's gradients went through the
# process group) first runs `action`.
DRIVER = """
import os, signal, sys
from tunelab.errors import TunelabError
from tunelab.train import loop

forward, calls = loop.forward, [0]

def patched_forward(*args):
    calls[0] += 1
    if calls[0] == 3:
        {action}
    return forward(*args)

loop.forward = patched_forward
from tunelab.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _launch_driver(action: str, config: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """`accelerate launch` on 2 processes of DRIVER doing `action`, output_dir tmp_path/out."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(action=action))
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"]
    cmd = [*launch, str(script), "train", "--config", str(config), "--quiet", f"output_dir={tmp_path / 'out'}"]
    # A hang shows as TimeoutExpired; the surviving rank is stopped by the launcher long before.
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120, cwd=REPO)


def test_a_killed_rank_fails_the_launch_instead_of_hanging(setup, tmp_path):
    _, config = setup
    done = _launch_driver('if os.environ.get("RANK") == "1": os.kill(os.getpid(), signal.SIGKILL)', config, tmp_path)
    assert done.returncode != 0
    assert "Signal 9 (SIGKILL)" in done.stderr or "exitcode  : -9" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "out" / "summary.json").exists()


def test_a_user_error_mid_run_ends_every_rank_with_its_one_line_and_status_2(setup, tmp_path):
    _, config = setup
    done = _launch_driver('raise TunelabError("step 2 cannot go on")', config, tmp_path)
    assert done.returncode != 0
    # Both ranks said what went wrong in one line and left with a usage error's status, not a signal.
    assert done.stderr.count("tunelab train: error: step 2 cannot go on\n") == 2, done.stderr[-3000:]
    assert done.stderr.count("exitcode  : 2 ") == 2, done.stderr[-3000:]
    assert "terminate called" not in done.stderr
    assert not (tmp_path / "out" / "summary.json").exists()
