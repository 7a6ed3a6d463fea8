"""FSDP2 on 2 gloo processes through the real CLI (`tunelab train --nproc 2 --accelerate-config fsdp2.yaml`).

The same code shards on GPUs (train/distributed.shard), so this is what a GPU run does, on CPU.
Tolerances: the runs are fp32 and see the same tokens per step; what differs is summation order (each rank's
share of the loss, FSDP's reduce-scatter of the gradients, the gradient norm summed shard by shard). Measured
here: losses within 2e-6 relative of the one-process run, so REL = 1e-5 as for DDP. Weights are compared through
what a user sees, the logits of the saved model: AdamW moves an element whose gradient is rounding noise by a noisy
fraction of lr (measured: 3e-5 on 2 of 87k elements after four steps at lr 1e-2), which moved the logits by 3e-6;
LOGITS_ATOL = 1e-4 leaves 30x room and is 1000x below what one training step changes them by here (> 0.1).
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

pytestmark = pytest.mark.slow

REL = 1e-5
LOGITS_ATOL = 1e-4
STEPS = 4
FSDP = str(REPO / "configs" / "accelerate" / "fsdp2.yaml")
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    """A config over the tiny model and 64 addition rows, evaluated every 2 steps (best/ is saved under FSDP)."""
    tmp = tmp_path_factory.mktemp("fsdp")
    config = small_run_config(tmp, tiny_model_dir, f"max_steps: {STEPS}\n")
    return tmp, config


def _fsdp(config: Path, *overrides: str, accelerate_config: str = FSDP) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tunelab.cli", "train", "--config", str(config), "--nproc", "2"]
    cmd += ["--accelerate-config", accelerate_config, "--quiet", *overrides]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=180, cwd=REPO)


def _launch_config(setup, method: str) -> str:
    """LoRA runs the shipped fsdp2.yaml, where every process reads the weights; full fine-tuning, where loading
    the whole model N times costs most, runs it with fsdp_cpu_ram_efficient_loading true: the main process alone
    reads them, the others build the model on the meta device and receive their shards. So each way of loading
    trains as one process does, saves and resumes."""
    if method == "lora":
        return FSDP
    shipped = Path(FSDP).read_text()
    assert "fsdp_cpu_ram_efficient_loading: false" in shipped
    once = setup[0] / "fsdp2-main-process-loads.yaml"
    once.write_text(shipped.replace("fsdp_cpu_ram_efficient_loading: false", "fsdp_cpu_ram_efficient_loading: true"))
    return str(once)


def _fsdp_run(setup, method: str) -> Path:
    """The output dir of `method`'s FSDP run on two processes with micro_batch 4, run once per module: both a
    test's subject and the resume tests' uninterrupted run."""
    tmp, config = setup
    out = tmp / f"{method}-fsdp"
    if not (out / "summary.json").exists():
        overrides = (f"method={method}", f"output_dir={out}", "save_steps=2")  # a checkpoint to resume from
        done = _fsdp(config, *overrides, accelerate_config=_launch_config(setup, method))
        assert done.returncode == 0, done.stderr[-3000:]
    return out


def _pair(setup, method: str) -> tuple[Path, Path]:
    """(one process with micro_batch 8, FSDP on two processes with micro_batch 4) output dirs for `method`."""
    from tunelab.config import load_config
    from tunelab.recipes.finetune import finetune

    tmp, config = setup
    out1 = tmp / f"{method}-one"
    out2 = _fsdp_run(setup, method)
    finetune(load_config(config, [f"output_dir={out1}", "micro_batch=8", f"method={method}"]), show_progress=False)
    return out1, out2


def _losses(out: Path) -> dict[str, float]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {f"{k}@{m['step']}": m[k] for m in lines for k in ("loss", "eval_loss") if k in m}


def _same_run(out1: Path, out2: Path) -> None:
    one, two = _losses(out1), _losses(out2)
    assert sorted(two) == sorted(one) and len(two) == STEPS + 2  # every step's loss, evaluations at steps 2 and 4
    for k in one:
        assert two[k] == pytest.approx(one[k], rel=REL), k


def _sharded(out: Path) -> None:
    """Each rank held about half of the parameters: a silent fallback to DDP would hold all of them."""
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2
    # Shards are whole rows (dim 0 split in 2, padded): half of each tensor, rounded up to a row.
    assert summary["params_local"] == pytest.approx(summary["params_total"] / 2, rel=0.01)


def _logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids).logits


IDS = torch.tensor([[5, 9, 12, 7, 30, 18, 4, 11, 9, 22]])


def test_fsdp2_full_fine_tuning_trains_as_one_process_and_saves_a_transformers_model(setup):
    """With the main process alone reading the weights (_launch_config)."""
    from transformers import AutoModelForCausalLM

    out1, out2 = _pair(setup, "full")
    _same_run(out1, out2)
    _sharded(out2)
    assert {p.name for p in out2.iterdir()} >= {"model", "best", "summary.json", "metrics.jsonl"}
    for folder in ("model", "best"):
        m1 = AutoModelForCausalLM.from_pretrained(out1 / folder)
        m2 = AutoModelForCausalLM.from_pretrained(out2 / folder)
        assert m2.dtype == torch.float32
        torch.testing.assert_close(_logits(m2, IDS), _logits(m1, IDS), rtol=0, atol=LOGITS_ATOL)
    base = AutoModelForCausalLM.from_pretrained(_base(setup))
    assert (_logits(m2, IDS) - _logits(base, IDS)).abs().max() > 100 * LOGITS_ATOL  # training changed the model


def test_fsdp2_lora_saves_an_adapter_that_peft_loads(setup):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out1, out2 = _pair(setup, "lora")
    _same_run(out1, out2)
    _sharded(out2)
    adapted = []
    for out in (out1, out2):
        base = AutoModelForCausalLM.from_pretrained(_base(setup))
        adapted.append(_logits(PeftModel.from_pretrained(base, out / "adapter"), IDS))
    torch.testing.assert_close(adapted[1], adapted[0], rtol=0, atol=LOGITS_ATOL)
    plain = _logits(AutoModelForCausalLM.from_pretrained(_base(setup)), IDS)
    assert (adapted[1] - plain).abs().max() > 100 * LOGITS_ATOL  # the adapter is not the identity


def _base(setup) -> Path:
    from tunelab.config import load_config

    return Path(load_config(setup[1], []).model)


# Runs `finetune()` under `accelerate launch` (2 processes, fsdp2.yaml) with the main process's checkpoint write
# failing.
DRIVER = """
import sys
from tunelab.config import load_config
from tunelab.errors import TunelabError
from tunelab.recipes.finetune import finetune
from tunelab.train import checkpoint

def fail(*args, **kwargs):
    raise TunelabError("checkpoint write failed")
checkpoint.save = fail
from tunelab.train.distributed import exit_launched

try:
    finetune(load_config(sys.argv[1], sys.argv[2:]), show_progress=False)
except TunelabError as e:
    sys.exit(f"error: {e}")
# As `tunelab train` does: a launched gloo process that reaches interpreter teardown can abort there.
sys.exit(exit_launched())
"""


def _launch_failing_save(tmp: Path, config: Path, *overrides: str):
    driver = tmp / "driver.py"
    driver.write_text(DRIVER)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", FSDP, "--num_processes", "2"]
    cmd += [str(driver), str(config), *overrides]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=180, cwd=REPO)


def _weights(out: Path, method: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    folder = out / ("model" if method == "full" else "adapter")
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def _resumed_as_uninterrupted(setup, method: str) -> Path:
    """The uninterrupted FSDP run's step-2 checkpoint (`tunelab train --nproc 2`, _fsdp_run) in a folder as a
    kill after it leaves one (its metrics lines, no final weights), resumed to the end by `tunelab train --nproc 2
    resume=true`: per-step losses and final weights equal to the uninterrupted run's (fp32, same processes, same
    reduction order, and the checkpoint holds the exact fp32 values: measured bit-identical; the bound leaves
    room for nothing but that order, 1e-6 relative). The folder has no best/ (a kill after step 2's evaluation
    would leave one): resuming beside it is tests/unit/train/test_eval.py's. Returns the checkpoint."""
    tmp, config = setup
    whole, cut = _fsdp_run(setup, method), tmp / f"{method}-cut"
    assert [p.name for p in (whole / "checkpoints").iterdir()] == ["step-0000002"]
    cut.mkdir()
    shutil.copytree(whole / "checkpoints", cut / "checkpoints")
    shutil.copy(whole / "metrics.jsonl", cut / "metrics.jsonl")  # lines past the checkpoint: the resume drops them
    resume = (f"method={method}", f"output_dir={cut}", "save_steps=2", "resume=true")
    done = _fsdp(config, *resume, accelerate_config=_launch_config(setup, method))
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = _losses(whole), _losses(cut)
    assert sorted(two) == sorted(one) and len(two) == STEPS + 2
    for k in one:
        assert two[k] == pytest.approx(one[k], rel=1e-6, abs=0), k
    expected, got = _weights(whole, method), _weights(cut, method)
    assert sorted(got) == sorted(expected)
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=1e-6, atol=0)
    return cut / "checkpoints" / "step-0000002"


def _full_tensors(path: Path, model: torch.nn.Module) -> None:
    """The checkpoint holds whole tensors, as one process writes them: the model's shapes, AdamW's two moments
    per trainable weight under torch.optim's integer keys."""
    from safetensors.torch import load_file

    from tunelab.train import checkpoint

    trainable = {n: list(p.shape) for n, p in model.named_parameters() if p.requires_grad}
    weights = load_file(path / "trainable.safetensors")
    assert {n: list(t.shape) for n, t in weights.items()} == trainable
    resume = checkpoint.read_resume(path)
    (group,) = resume["optimizer"]["param_groups"]
    assert group["params"] == list(range(len(trainable)))
    state = resume["optimizer"]["state"]
    assert [list(state[i]["exp_avg"].shape) for i in group["params"]] == list(trainable.values())
    assert [list(state[i]["exp_avg_sq"].shape) for i in group["params"]] == list(trainable.values())
    assert checkpoint.verify(path) is None


def test_fsdp2_full_fine_tuning_resumes_from_a_checkpoint_as_if_never_stopped(setup, tmp_path):
    from transformers import AutoModelForCausalLM

    from tunelab.config import load_config
    from tunelab.recipes.finetune import finetune

    path = _resumed_as_uninterrupted(setup, "full")
    _full_tensors(path, AutoModelForCausalLM.from_pretrained(_base(setup)))
    # The same checkpoint resumes on one process (micro_batch 8 = 2 x 4): the FSDP run's losses, up to the
    # summation order (REL, as above).
    one = tmp_path / "one"
    finetune(
        load_config(setup[1], [f"output_dir={one}", "micro_batch=8", "method=full", f"resume={path}"]),
        show_progress=False,
    )
    fsdp = _losses(_fsdp_run(setup, "full"))
    got = _losses(one)
    assert sorted(got) == ["eval_loss@4", "loss@3", "loss@4"]
    for k in got:
        assert got[k] == pytest.approx(fsdp[k], rel=REL), k


def test_fsdp2_lora_resumes_from_a_checkpoint_as_if_never_stopped(setup):
    from transformers import AutoModelForCausalLM

    from tunelab.config import load_config
    from tunelab.model.adapters import apply_adapter

    path = _resumed_as_uninterrupted(setup, "lora")
    cfg = load_config(setup[1], ["method=lora"])
    _full_tensors(path, apply_adapter(AutoModelForCausalLM.from_pretrained(_base(setup)), cfg.adapter))


def test_a_failed_checkpoint_write_ends_every_fsdp_process(setup, tmp_path):
    """The main process fails writing its checkpoint while the other waits for it: the launcher ends the run at
    once with the main process's error, instead of the other waiting out the process group's timeout."""
    tmp, config = setup
    out = tmp_path / "o"
    done = _launch_failing_save(tmp, config, f"output_dir={out}", "save_steps=2")
    assert done.returncode != 0
    assert "error: checkpoint write failed" in done.stderr
    assert not (out / "checkpoints").exists() and not (out / "model").exists()
