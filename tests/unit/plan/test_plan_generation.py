"""plan/generation.py and `tunelab plan` on a grpo config: sampling time from the model's bytes, the KV cache's
bytes and FLOPs per decode step, the scoring passes as forwards, the step printed by part."""

from __future__ import annotations

import json

import pytest
from conftest import write_jsonl
from test_plan import small_arch

from tunelab.cli import main
from tunelab.plan.generation import DECODE_LOGIT_BYTES, GrpoStep, generation, kv_bytes_per_token, sampling_memory
from tunelab.plan.grpo import expected_longest


def grpo_config_file(tmp_path, model_dir, beta: float = 0.0, long_answers: bool = False, method: str = "lora"):
    """A GRPO config over 20 addition prompts: micro-batch 2, G = 4, completions of up to 16 tokens (answers past
    that cap with `long_answers`)."""
    rows = [{"instruction": f"{a} + {a}", "answer": str(2 * a) * (20 if long_answers else 1)} for a in range(20)]
    data = write_jsonl(tmp_path / "prompts.jsonl", rows)
    config = tmp_path / "grpo.yaml"
    config.write_text(
        f"model: {model_dir}\nmethod: {method}\nobjective: grpo\ndata:\n  path: {data}\n  template: compact\nseq_len: 64\n"
        f"micro_batch: 2\ngrpo:\n  num_generations: 4\n  max_completion_length: 16\n  beta: {beta}\n"
        "  rewards:\n    - name: exact_answer\n"
    )
    return config


def test_decode_is_bytes_over_bandwidth_when_memory_bound():
    arch = small_arch()
    got = generation(
        arch, rows=4, prompt_tokens=10, completion_tokens=6, compute_bytes=2, peak_flops=1e15, bandwidth_bps=1e9
    )
    kv = kv_bytes_per_token(arch, 2)
    assert kv == 2 * 2 * 2 * 16 * 2
    step_bytes = arch.total_params * 2 + kv * 4 * (10 + 3)
    assert got.decode_bytes == step_bytes
    assert got.decode_s == pytest.approx(6 * step_bytes / 1e9)
    assert got.prefill_s == pytest.approx(2 * arch.total_params * 4 * 10 / 1e15)
    assert got.kv_cache_bytes == kv * 4 * 16


def test_decode_is_flops_over_peak_when_compute_bound_and_overhead_per_forward():
    arch = small_arch()
    got = generation(arch, 1000, 10, 5, 2, peak_flops=1e6, bandwidth_bps=1e15, step_overhead_s=0.01)
    assert got.decode_s == pytest.approx(5 * (2 * arch.total_params * 1000 / 1e6 + 0.01))


def test_expected_longest_is_the_mean_maximum_of_the_batchs_draws():
    import itertools

    lengths = [2, 2, 3, 5, 9]
    assert expected_longest(lengths, 1) == pytest.approx(sum(lengths) / 5)
    pairs = list(itertools.product(lengths, repeat=2))  # draws with replacement: every ordered pair equally likely
    assert expected_longest(lengths, 2) == pytest.approx(sum(max(p) for p in pairs) / len(pairs))
    assert expected_longest(lengths, 200) == pytest.approx(9, abs=1e-9)


def test_sampling_memory_counts_the_kv_cache_logits_and_the_cpus_packed_weights():
    arch = small_arch()
    gen = generation(arch, 8, 10, 6, 4, 1e12, 1e9)
    fp32 = sampling_memory(arch, gen, 4, on_cpu=True, adapter_unpacked=False)
    assert fp32.packed_weights == arch.matmul_params * 4  # every linear reordered, the LM head included
    assert fp32.kv_cache == gen.kv_cache_bytes and fp32.logits == 8 * arch.vocab * DECODE_LOGIT_BYTES
    few = generation(arch, 4, 10, 6, 4, 1e12, 1e9)  # below PREPACK_MIN_ROWS: nothing reordered
    assert sampling_memory(arch, few, 4, on_cpu=True, adapter_unpacked=False).packed_weights == 0
    bf16 = generation(arch, 8, 10, 6, 2, 1e12, 1e9)
    for unpacked in (False, True):  # bf16 weights reordered too, a compiled policy's [W | sB] among them
        assert sampling_memory(arch, bf16, 2, True, unpacked).packed_weights == arch.matmul_params * 2
    # Full fine-tuning's fp32 master weights under bf16 autocast are not reordered
    assert sampling_memory(arch, bf16, 2, True, False, fp32_master=True).packed_weights == 0
    few_bf16 = generation(arch, 4, 10, 6, 2, 1e12, 1e9)
    assert sampling_memory(arch, few_bf16, 2, on_cpu=True, adapter_unpacked=True).packed_weights == (
        arch.block_linear_params * 2  # below the rows: a compiled policy's [W | sB] copy while it samples
    )
    assert sampling_memory(arch, gen, 4, on_cpu=False, adapter_unpacked=True).packed_weights == 0


def test_step_parts_add_up():
    gen = generation(small_arch(), 4, 10, 6, 2, 1e12, 1e9)
    step = GrpoStep(gen, scoring_passes=2, update_s=3.0, iterations=2)
    assert step.parts()["scoring passes"] == pytest.approx(2.0)  # each a forward: a third of an update
    assert step.batch_s == pytest.approx(sum(step.parts().values()))
    assert step.parts()["update"] == 6.0


def test_plan_cli_on_a_grpo_config(tmp_path, tiny_model_dir, capsys):
    config = grpo_config_file(tmp_path, tiny_model_dir, beta=0.1)
    assert main(["plan", "--config", str(config), "--gpu", "h100-sxm", "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["prompts"] == 20 and record["rows_per_batch"] == 8 and record["batches"] == 10
    assert set(record["parts_s"]) == {"prefill", "decode", "scoring passes", "update"}
    assert record["parts_s"]["scoring passes"] > 0  # beta > 0: the reference pass
    assert record["kv_cache_bytes"] > 0 and record["memory_bytes"] > record["kv_cache_bytes"]
    assert main(["plan", "--config", str(config), "--gpu", "h100-sxm"]) == 0
    text = capsys.readouterr().out
    # The decode steps from the rows: each answer's tokens plus EOS, the longest of a batch's 2 prompts expected.
    from transformers import AutoTokenizer

    answers = AutoTokenizer.from_pretrained(tiny_model_dir)([str(2 * a) for a in range(20)], add_special_tokens=False)
    steps = expected_longest([len(ids) + 1 for ids in answers["input_ids"]], 2)
    assert record["decode_steps"] == pytest.approx(steps, abs=0.05) and steps < 16
    assert "each prompt's `answer` tokenized plus EOS" in text and "KL term trains on all" in text
    assert "time_limited_from_batches" not in record
    # A time limit of three and a half batches: the run ends between batches, after three.
    limit = f"max_minutes={3.5 * record['batch_s'] / 60}"
    assert main(["plan", "--config", str(config), "--gpu", "h100-sxm", "--json", limit]) == 0
    cut = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (cut["batches"], cut["time_limited_from_batches"]) == (3, 10)
    assert cut["time_s"] == pytest.approx(3 * record["batch_s"])
    assert main(["plan", "--config", str(config), "--gpu", "h100-sxm", limit]) == 0
    text = capsys.readouterr().out
    assert "ends training after 3 of the schedule's 10 batches" in text and "schedule_within_limit" not in text
    # The run's key, and grpo's earlier name for it.
    for key in ("schedule_within_limit", "grpo.schedule_within_limit"):
        assert main(["plan", "--config", str(config), "--gpu", "h100-sxm", limit, f"{key}=true"]) == 0
        assert "10 batches; schedule_within_limit ends the learning-rate schedule there" in " ".join(
            capsys.readouterr().out.split()
        )


def test_prefill_runs_over_the_distinct_prompts_only():
    arch = small_arch()
    every_row = generation(arch, 8, 10, 6, 2, 1e12, 1e9)
    shared = generation(arch, 8, 10, 6, 2, 1e12, 1e9, distinct_prompts=2)
    assert shared.prefill_s == pytest.approx(every_row.prefill_s / 4)
    assert shared.decode_s == every_row.decode_s  # every row still decodes its own tokens


def test_scoring_scale_applies_to_the_scoring_passes_only():
    gen = generation(small_arch(), 4, 10, 6, 2, 1e12, 1e9)
    step = GrpoStep(gen, scoring_passes=1, update_s=3.0, iterations=1, scoring_scale=0.5)
    assert step.parts()["scoring passes"] == pytest.approx(0.5) and step.parts()["update"] == 3.0


def test_grpo_constants_read_a_devices_row_of_grpo_yaml(monkeypatch):
    from tunelab.plan import catalog

    row = {"constants": {"decode_op_s": 1.5e-4, "update_scale": 0.8, "scoring_scale": 1.2}, "rows": ["run-a"]}
    monkeypatch.setattr(catalog, "read", lambda name: {"devices": {"cpu-fp32": row}} if name == "grpo.yaml" else {})
    assert catalog.grpo_constants("cpu-fp32") == catalog.GrpoConstants(1.5e-4, 0.8, 1.2, ("run-a",))
    assert catalog.grpo_constants("cpu-fp32").decode_flop_efficiency == 1.0  # a fit from one batch size
    assert catalog.grpo_constants("no-such-device") is None
    row["constants"]["decode_flop_efficiency"] = 0.45
    assert catalog.grpo_constants("cpu-fp32").decode_flop_efficiency == 0.45


def test_decode_flop_efficiency_divides_the_flop_bound_decode_step_only():
    arch = small_arch()
    full = generation(arch, 1000, 10, 5, 2, peak_flops=1e6, bandwidth_bps=1e15, step_overhead_s=0.01)
    half = generation(
        arch, 1000, 10, 5, 2, peak_flops=1e6, bandwidth_bps=1e15, step_overhead_s=0.01, decode_flop_efficiency=0.5
    )
    assert half.decode_s - 5 * 0.01 == pytest.approx(2 * (full.decode_s - 5 * 0.01))
    assert half.prefill_s == full.prefill_s
    memory_bound = dict(peak_flops=1e15, bandwidth_bps=1e3, step_overhead_s=0.0)
    assert generation(arch, 4, 10, 5, 2, **memory_bound, decode_flop_efficiency=0.5).decode_s == pytest.approx(
        generation(arch, 4, 10, 5, 2, **memory_bound).decode_s
    )


def test_every_fitted_row_of_the_shipped_grpo_yaml_reads():
    from tunelab.plan import catalog

    for device in (catalog.read("grpo.yaml") or {}).get("devices") or {}:
        fit = catalog.grpo_constants(device)
        assert fit.rows and fit.decode_op_s > 0 and fit.update_scale > 0 and fit.scoring_scale > 0
        assert 0 < fit.decode_flop_efficiency <= 1


def test_plan_applies_a_devices_grpo_fit(tmp_path, tiny_model_dir, monkeypatch, capsys):
    from tunelab.plan import catalog

    config = grpo_config_file(tmp_path, tiny_model_dir, beta=0.1)

    def parts(fit):
        monkeypatch.setattr(catalog, "grpo_constants", lambda device: fit)
        assert main(["plan", "--config", str(config), "--gpu", "h100-sxm", "--json"]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["parts_s"]

    base = parts(catalog.GrpoConstants(0.0, 1.0, 1.0, ()))
    slower = parts(catalog.GrpoConstants(1e-3, 2.0, 0.5, ()))
    assert slower["decode"] > base["decode"] and slower["prefill"] > base["prefill"]  # per-op cost per forward
    assert slower["update"] == pytest.approx(2 * base["update"])
    assert slower["scoring passes"] == pytest.approx(base["scoring passes"])  # 2 x 0.5


def test_shipped_grpo_fit_of_the_fp32_cpu_class_changes_plans_prediction(tmp_path, tiny_model_dir, monkeypatch):
    """catalog/grpo.yaml's cpu-fp32 row (benchmarks/scripts/plan_grpo.py --write) is what plan uses on that class:
    its update is plan's own times update_scale and its decode pays decode_op_s per op, not the step fit's."""
    from tunelab import config as cfgmod
    from tunelab.plan import catalog
    from tunelab.plan.estimate import Device
    from tunelab.recipes import predict

    shipped = catalog.grpo_constants("cpu-fp32")
    assert shipped is not None and any("quickstart-grpo_xeon-fp32-2c" in row for row in shipped.rows)
    cpu = catalog.Gpu("local", "a fp32-only CPU", 16 * 2**30, 20.0, 2e11, False, "cpu-fp32", "test")
    monkeypatch.setattr(predict, "local_device", lambda *a, **k: Device(cpu, catalog.runtime_overhead("cpu")))
    config = grpo_config_file(tmp_path, tiny_model_dir)
    cfg = cfgmod.load_config(config, [])
    fitted = predict.plan_generating(cfg, predict.PlanRequest(gpu="local"))[0].step
    monkeypatch.setattr(catalog, "grpo_constants", lambda device: None)
    unfitted = predict.plan_generating(cfg, predict.PlanRequest(gpu="local"))[0].step
    assert fitted.update_s == pytest.approx(unfitted.update_s * shipped.update_scale)
    assert fitted.update_s != pytest.approx(unfitted.update_s, rel=0.01)
    assert fitted.generation.decode_s != pytest.approx(unfitted.generation.decode_s, rel=0.01)


def test_a_trial_runs_decode_steps_and_update_share_calibrate_plan(tmp_path, tiny_model_dir, capsys):
    """`--from-run` (and the API's from_run) takes the decode steps (the median batch's longest completion) and the
    update's share of completions from a GRPO run's metrics.jsonl; with beta 0 the update scales by the share."""
    import tunelab

    config = grpo_config_file(tmp_path, tiny_model_dir, long_answers=True)  # the rows' answers reach the cap
    trial = tmp_path / "trial"
    trial.mkdir()
    write_jsonl(
        trial / "metrics.jsonl",
        [
            {
                "step": i + 1,
                "generation_s": 1.0,
                "completions/max_length": n,
                "update_completions": k,
                "completions_per_batch": 8,
                "frac_reward_zero_std": 0.0,
            }
            for i, (n, k) in enumerate([(8, 2), (10, 4), (12, 6)])
        ],
    )

    def plan(*flags):
        assert main(["plan", "--config", str(config), "--gpu", "h100-sxm", "--json", *flags]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    bound, given, calibrated = (
        plan(),
        plan("--completion-tokens", "10", "--signal-share", "0.5"),
        plan("--from-run", str(trial)),
    )
    assert (bound["decode_steps"], bound["update_share"]) == (16, 1.0)
    assert (calibrated["decode_steps"], calibrated["update_share"]) == (10, 0.5)
    assert calibrated["batch_s"] == pytest.approx(given["batch_s"])
    assert calibrated["parts_s"]["decode"] < bound["parts_s"]["decode"]
    # Half the completions over rows of 10 completion tokens instead of 16: less than half the update's time.
    assert calibrated["parts_s"]["update"] < 0.5 * bound["parts_s"]["update"]
    assert main(["plan", "--config", str(config), "--gpu", "h100-sxm", "--from-run", str(trial)]) == 0
    assert f"from {trial} (3 generation batches)" in capsys.readouterr().out
    api = tunelab.estimate(config, gpu="h100-sxm", from_run=trial)[0]
    assert api.step.batch_s == pytest.approx(calibrated["batch_s"]) and api.time_s > 0
    # Under a KL term the update trains every completion whatever the trial says.
    kl = plan("--from-run", str(trial), "grpo.beta=0.1")
    assert kl["update_share"] == 1.0


def test_from_run_without_a_grpo_runs_metrics_is_one_line(tmp_path, tiny_model_dir, capsys):
    rows = [{"instruction": "1 + 1", "answer": "2"}]
    data = write_jsonl(tmp_path / "prompts.jsonl", rows)
    config = tmp_path / "grpo.yaml"
    config.write_text(
        f"model: {tiny_model_dir}\nobjective: grpo\ndata:\n  path: {data}\n  template: compact\n"
        "grpo:\n  rewards:\n    - name: exact_answer\n"
    )
    assert main(["plan", "--config", str(config), "--from-run", str(tmp_path / "nope")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "metrics.jsonl" in err[0] and "--from-run" in err[0]


def trial_folder(path, config=None, generation_s=(9.0, 4.0, 5.0, 4.5), rest_s=(6.0, 7.0, 6.5)):
    """A GRPO run's folder: metrics of batches that sampled `generation_s` and then took `rest_s` more (the first
    batch's rest is its warm-up, left out), 12-token completions, the update over every completion."""
    path.mkdir()
    elapsed, records = 0.0, []
    for i, gen in enumerate(generation_s):
        elapsed += gen + (rest_s[i - 1] if i else 20.0)
        records.append(
            {
                "step": i + 1,
                "generation_s": gen,
                "elapsed_s": elapsed,
                "completions/max_length": 12,
                "update_completions": 8,
                "completions_per_batch": 8,
            }
        )
    write_jsonl(path / "metrics.jsonl", records)
    if config is not None:
        (path / "config.yaml").write_text(config.read_text())
    return path


def fake_local_cpu(monkeypatch):
    from tunelab.plan import catalog
    from tunelab.plan.estimate import Device
    from tunelab.recipes import predict

    cpu = catalog.Gpu("local", "a fp32-only CPU", 16 * 2**30, 20.0, 2e11, False, "cpu-fp32", "test")
    monkeypatch.setattr(predict, "local_device", lambda *a, **k: Device(cpu, catalog.runtime_overhead("cpu")))


def test_a_trial_on_this_machine_calibrates_plans_rates(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """On `--gpu local` a trial run's times scale plan's sampling and its scoring passes and update to what the
    trial measured (its median batch, the warm-up batch left out): the trial's own config is then predicted at
    its measured batch, and another batch shape by the same factors. Other GPUs take only the workload."""
    import tunelab

    fake_local_cpu(monkeypatch)
    config = grpo_config_file(tmp_path, tiny_model_dir, beta=0.1)
    trial = trial_folder(tmp_path / "trial", config)

    def plan(gpu, *flags):
        assert main(["plan", "--config", str(config), "--gpu", gpu, "--json", *flags]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    measured = plan("local", "--from-run", str(trial))
    parts = measured["parts_s"]
    assert parts["prefill"] + parts["decode"] == pytest.approx(4.5)  # the median of batches 2-4
    assert parts["scoring passes"] + parts["update"] == pytest.approx(6.5)
    assert measured["batch_s"] == pytest.approx(11.0)
    assert main(["plan", "--config", str(config), "--gpu", "local", "--from-run", str(trial)]) == 0
    assert "this machine's rates from the trial: sampling x" in capsys.readouterr().out
    # Twice the prompts a batch: plan's own ratio between the shapes, at the trial's rates.
    given = plan("local", "--completion-tokens", "12", "--signal-share", "1")
    given2 = plan("local", "--completion-tokens", "12", "--signal-share", "1", "grad_accum=2")
    double = plan("local", "--from-run", str(trial), "grad_accum=2")
    sampling = 4.5 / (given["parts_s"]["prefill"] + given["parts_s"]["decode"])
    rest = 6.5 / (given["parts_s"]["scoring passes"] + given["parts_s"]["update"])
    assert double["parts_s"]["decode"] == pytest.approx(given2["parts_s"]["decode"] * sampling)
    assert double["parts_s"]["update"] == pytest.approx(given2["parts_s"]["update"] * rest)
    assert double["batch_s"] > measured["batch_s"]
    # A catalog GPU is not this machine: the trial's decode steps only.
    h100 = plan("h100-sxm", "--from-run", str(trial))
    assert h100["batch_s"] == pytest.approx(plan("h100-sxm", "--completion-tokens", "12")["batch_s"])
    api = tunelab.estimate(config, gpu="local", from_run=trial)[0]
    assert api.step.batch_s == pytest.approx(11.0)


def test_a_trial_of_another_batch_shape_is_predicted_at_its_own(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """The factors come from the trial's batch shape (its config.yaml), not the planned one's: a trial at one
    prompt a batch calibrates a plan at two, and that plan at one prompt gives the trial's time back."""
    fake_local_cpu(monkeypatch)
    config = grpo_config_file(tmp_path, tiny_model_dir, beta=0.1)
    single = tmp_path / "single.yaml"
    single.write_text(config.read_text().replace("micro_batch: 2", "micro_batch: 1"))
    trial = trial_folder(tmp_path / "trial", single)

    def plan(*flags):
        assert main(["plan", "--config", str(config), "--gpu", "local", "--json", *flags]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    assert plan("--from-run", str(trial), "micro_batch=1")["batch_s"] == pytest.approx(11.0)
    assert plan("--from-run", str(trial))["batch_s"] > 11.0
    # Without config.yaml the trial is taken as this config's shape.
    (trial / "config.yaml").unlink()
    assert plan("--from-run", str(trial))["batch_s"] == pytest.approx(11.0)


def test_a_one_batch_trial_gives_the_workload_not_the_rates(tmp_path, tiny_model_dir, monkeypatch, capsys):
    fake_local_cpu(monkeypatch)
    config = grpo_config_file(tmp_path, tiny_model_dir, beta=0.1)
    trial = trial_folder(tmp_path / "trial", config, generation_s=(9.0,), rest_s=())
    assert main(["plan", "--config", str(config), "--gpu", "local", "--json", "--from-run", str(trial)]) == 0
    one = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["plan", "--config", str(config), "--gpu", "local", "--json", "--completion-tokens", "12"]) == 0
    assert one["batch_s"] == pytest.approx(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["batch_s"])


def test_plan_renders_a_grpo_plan_as_markdown_like_every_plan(tmp_path, tiny_model_dir, capsys):
    config = grpo_config_file(tmp_path, tiny_model_dir, beta=0.1)
    assert main(["plan", "--config", str(config), "--gpu", "h100-sxm,a100-80gb", "--format", "md"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"# Performance plan: {config}")
    for heading in ("## Workload", "## GPU comparison", "## A generation batch by part", "## Assumptions"):
        assert heading in text, heading
    assert "| GPU | batch | batches | time | memory | KV cache |" in text
    assert "| GPU | prefill | decode | scoring passes | update |" in text
    assert text.count("the decode steps from the rows") == 1  # one line for the devices that share it
    assert "- memory breakdown (first GPU): " in text and "sampling kv cache" in text


def test_full_fine_tuning_with_beta_keeps_a_frozen_reference_and_plan_counts_it(tmp_path, tiny_model_dir):
    """beta > 0 under full fine-tuning holds a frozen copy of the starting weights (methods.Method.reference) for the
    KL term's scoring pass: plan's weights grow by that copy; under LoRA the reference is the adapter disabled.
    Counted from the method and objective rows, whether or not the recipe runs full fine-tuning yet."""
    from dataclasses import replace

    from tunelab.config import load_config
    from tunelab.plan import catalog
    from tunelab.plan.estimate import Device
    from tunelab.plan.grpo import GrpoWorkload, Prompts, plan_grpo
    from tunelab.plan.job import Job
    from tunelab.sources import resolve_arch

    job = Job.of(load_config(grpo_config_file(tmp_path, tiny_model_dir), ["precision=fp32"]))
    arch = resolve_arch(str(tiny_model_dir))
    device = Device(catalog.gpu("h100-sxm"), catalog.runtime_overhead("cuda"))

    def weights(beta, method):
        objective = replace(job.objective, grpo=replace(job.objective.grpo, beta=beta))
        changed = replace(job.but(method=method), objective=objective)
        plan = plan_grpo(changed, arch, Prompts(20, 8.0, "test"), GrpoWorkload(), device)
        return plan.memory_parts["weights"]

    assert weights(0.1, "full") - weights(0.0, "full") == arch.total_params * 4  # fp32 master weights
    assert weights(0.1, "lora") == weights(0.0, "lora")


def test_the_key_of_a_devices_fitted_constants_is_one_function():
    """plan's step model and its GRPO plan file a device's constants under one key (plan/estimate.constants_key),
    and tunelab defines one device_key (a calibration record's, from a device name)."""
    import ast
    from pathlib import Path

    import tunelab

    defined = [
        f"{path.name}:{node.name}"
        for path in Path(tunelab.__file__).parent.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name in ("device_key", "constants_key")
    ]
    assert sorted(defined) == ["calibration.py:device_key", "estimate.py:constants_key"]
