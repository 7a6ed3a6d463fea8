"""plan's evaluation time: the forward-only FLOP formula, the evaluation count, and the prediction beside what a
tiny run measured."""

import json

import pytest
from conftest import tiny_train_config as config
from conftest import write_jsonl

from tunelab.cli import main
from tunelab.config import BatchConfig
from tunelab.plan import arch as archmod
from tunelab.plan import catalog, timing, workload
from tunelab.plan.calibration import CalibrationRecord
from tunelab.plan.estimate import Device, Job, estimate
from tunelab.plan.flops import flops_per_token, forward_flops_per_token
from tunelab.recipes.finetune import finetune
from tunelab.recipes.predict import dataset_lengths
from tunelab.sources import resolve_arch

LLAMA2 = "meta-llama/Llama-2-7b-hf"


def test_forward_flops_are_the_forward_part_of_each_step_term():
    a = resolve_arch(LLAMA2)
    n = a.matmul_params
    attn_fwd = 4 * 32 * 32 * 128 * 512
    # Full fine-tuning: a forward is exactly a third of a training step.
    full = forward_flops_per_token(a, "full", (), 0, 512)
    assert full == 2 * n + attn_fwd == flops_per_token(a, "full", (), 0, 512, grad_ckpt=False).model / 3
    # LoRA: 2N of the frozen base's 4N, a third of attention and of the adapters.
    lora = forward_flops_per_token(a, "lora", ("q_proj", "v_proj"), 8, 512)
    adapters = 32 * 8 * (4096 + 4096) * 2  # q_proj and v_proj
    assert lora == 2 * n + attn_fwd + 2 * adapters
    step = flops_per_token(a, "lora", ("q_proj", "v_proj"), 8, 512, grad_ckpt=False).model
    assert lora / step == pytest.approx(0.5, abs=0.01)


@pytest.mark.parametrize("steps, every, count", [(50, 10, 5), (50, 7, 8), (50, 0, 1), (1, 5, 1)])
def test_evaluation_count_is_every_multiple_and_the_end(steps, every, count):
    held = workload.assumed_lengths(100, 64, 0.5)
    b = workload.Batching(BatchConfig(seq_len=256, micro_batch=4, grad_accum=2, packing=True), data_parallel=4)
    v = workload.evaluations(held, b, steps, every)
    assert v.count == count
    assert v.tokens_padded == 25 * 256 and v.tokens_loss == 100 * 32  # 4 per row, 25 rows, one rank's batching


def test_evaluation_seconds_and_plan_output_only_with_eval(capsys):
    assert timing.evaluation_seconds(1000, 2e9, 1e12, 0.5) == pytest.approx(4.0)
    args = ["plan", "--gpu", "h100-sxm", "--examples", "1000", "--model", LLAMA2, "save_steps=10"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert "evaluation" not in plain
    assert main([*args, "eval.split=0.2", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["examples"] == 800 and rec["optimizer_steps"] == 50 and rec["evaluations"] == 5
    assert rec["eval_tokens_padded"] == 200 * 256  # 2 examples of 256 tokens per 512-token row
    a = resolve_arch(LLAMA2)
    fwd = forward_flops_per_token(a, "lora", archmod.adapter_targets(a, "all-linear"), 16, 512)
    expected = 5 * 200 * 256 * fwd / (rec["peak_flops"] * rec["efficiency"])
    assert rec["overheads_s"]["evaluation"] == pytest.approx(expected)
    assert main([*args, "eval.split=0.2"]) == 0
    table = capsys.readouterr().out
    assert "; 5 evaluations" in table and "+ evaluation " in table


@pytest.mark.slow
def test_predicted_eval_time_beside_a_measured_run(tiny_model_dir, tmp_path, addition_rows):
    """plan, calibrated to the run's own training rate, predicts its evaluations from the forward-only FLOPs:
    the evaluation count and held-out tokens are exact, and the time within a factor of 3 of what the run
    measured (a forward is about half a LoRA step here; per-call overheads make the tiny model's ratio loose)."""
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    cfg = config(tiny_model_dir, data, tmp_path / "run", "epochs=2", "eval.split=0.25", "eval.steps=3")
    summary = finetune(cfg, show_progress=False)

    arch = resolve_arch(cfg.model)
    peak = 1e12
    gpu = catalog.Gpu("local", "cpu", 2**34, 0.0, peak, False, "cpu-fp32", source="test")
    first = Device(gpu, 0, None)
    lengths = dataset_lengths(cfg, None)
    s = Job.of(cfg)
    # Efficiency such that plan's training rate is the rate the run measured.
    hardware = estimate(arch, lengths, s, first).flops.hardware
    efficiency = summary["tokens_padded_per_s"] * hardware / peak
    device = Device(gpu, 0, CalibrationRecord("local", "cpu", peak, efficiency={"lora": efficiency}))
    e = estimate(arch, lengths, s, device)

    assert e.work.optimizer_steps == summary["total_steps"]  # the held-out rows are not trained on
    assert e.evaluations.count == summary["evaluations"]
    assert e.evaluations.tokens_padded == summary["eval_tokens_padded"]
    assert e.evaluations.tokens_loss == summary["eval_tokens_loss"]
    assert e.speed.tokens_per_s == pytest.approx(summary["tokens_padded_per_s"])
    measured = sum(m["eval_s"] for m in map(json.loads, (tmp_path / "run" / "metrics.jsonl").open()) if "eval_s" in m)
    assert measured == pytest.approx(summary["eval_s"])
    assert 1 / 3 < e.overheads.eval_s / measured < 3, (e.overheads.eval_s, measured)

    # The same config without eval: every row trains (two epochs of them), and no evaluation time.
    whole = dataset_lengths(config(tiny_model_dir, data, tmp_path / "off", "epochs=2"), None)
    without = estimate(arch, whole, s, device)
    assert without.evaluations is None and without.overheads.eval_s == 0.0
    assert without.work.tokens_nonpad == e.work.tokens_nonpad + 2 * summary["eval_tokens_nonpad"]
