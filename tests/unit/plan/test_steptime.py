"""plan's step-time model: its parts, the compile effect, the fitted constants and leaving a device out,
the hf-peft stack, and the useful (document-causal) attention."""

from dataclasses import replace

import numpy as np
import pytest

from tunelab import methods
from tunelab.cli import main
from tunelab.config import AdapterConfig, BatchConfig, ComputeConfig, LoraConfig, RunConfig
from tunelab.plan import arch as archmod
from tunelab.plan import catalog, fit, steptime, workload
from tunelab.plan.estimate import Device, Job, estimate
from tunelab.plan.flops import flops_per_token
from tunelab.sources import resolve_arch

REPO_FILES = ("benchmarks/", "../shared/")


def one_b() -> archmod.Arch:
    return resolve_arch("random:llama-3.2-1b")


def settings(**kw) -> Job:
    """LoRA r 16 on every linear layer, seq 2048 packed, micro-batch 8, eager, bf16."""
    job = Job(
        adapter=AdapterConfig(lora=LoraConfig(r=16)),
        batch=BatchConfig(seq_len=2048, micro_batch=8),
        compute=ComputeConfig(precision="bf16", compile=False),
        run=RunConfig(save_total_limit=1),
    )
    return job.but(**kw)


def lengths() -> workload.Lengths:
    arr = np.random.default_rng(0).integers(100, 1200, 2000)
    return workload.Lengths(len(arr), float(arr.mean()), float(arr.mean()) / 2, "test", arr)


def h200() -> Device:
    return Device(catalog.gpu("h200"), catalog.runtime_overhead("cuda"))


def test_attention_keys_count_document_causal_pairs_or_the_padded_rectangle():
    # documents of 1 and 3 tokens: 1 + (1 + 2 + 3) pairs over 4 tokens
    assert steptime.attention_keys(np.array([1, 3]), 0, 2048, packing=True) == pytest.approx(7 / 4)
    assert steptime.attention_keys(None, 0, 512, packing=False) == 512


def test_useful_attention_counts_documents_not_whole_rows():
    a = one_b()
    t = archmod.adapter_targets(a, "all-linear")
    keys = steptime.attention_keys(np.array([684] * 10), 0, 2048, True)
    f = flops_per_token(a, "lora", t, 16, 2048, False, doc_keys=keys)
    assert f.attention_useful == pytest.approx(f.attention * keys / 2048)
    assert f.model - f.useful == pytest.approx(f.attention - f.attention_useful)
    assert flops_per_token(a, "lora", t, 16, 2048, False).useful == pytest.approx(f.model)


def test_roofline_sends_rank_r_products_to_memory_and_big_gemms_to_the_units():
    ridge = fit.ridge("cuda", 989e12, 4.8e12)
    flops, moved = steptime.split_gemms([(16384, 4096, 16, 1)], 2, ridge)
    assert flops == 0 and moved > 0
    flops, moved = steptime.split_gemms([(16384, 4096, 4096, 1)], 2, ridge)
    assert flops == 2 * 16384 * 4096 * 4096 and moved == 0


def test_breakdown_has_every_part_and_sums_to_the_step():
    e = estimate(one_b(), lengths(), settings(), h200())
    b = e.step
    assert min(b.matmul_s, b.attention_s, b.memory_s, b.fixed_s) > 0
    assert b.total == pytest.approx(b.matmul_s + b.attention_s + b.memory_s + b.fixed_s)
    per_step = e.work.epoch.tokens_padded / e.work.epoch.micro_batches
    assert e.speed.tokens_per_s == pytest.approx(per_step / b.total)


def test_compile_fuses_bytes_and_launches_and_speeds_the_step_up():
    eager = estimate(one_b(), lengths(), settings(), h200())
    compiled = estimate(one_b(), lengths(), settings(compile=True), h200())
    assert compiled.step.memory_s < 0.7 * eager.step.memory_s
    assert compiled.step.fixed_s < 0.6 * eager.step.fixed_s
    assert compiled.step.matmul_s == pytest.approx(eager.step.matmul_s)
    assert compiled.speed.tokens_per_s > 1.15 * eager.speed.tokens_per_s


def test_hf_peft_stack_pads_runs_eager_and_prices_its_masked_kernel():
    s = settings(compile=True)
    ours = estimate(one_b(), lengths(), s, h200())
    peer = estimate(one_b(), lengths(), s.but(stack="hf-peft"), h200())
    assert not peer.job.batch.packing and not peer.job.compute.compile

    # padded rows: every query meets its row's whole width, not its own document's causal prefix
    def per_token(e):
        return e.step.attention_s * e.work.epoch.micro_batches / e.work.epoch.tokens_padded

    assert per_token(peer) > 1.5 * per_token(ours)
    assert peer.step.fixed_s > ours.step.fixed_s  # eager launches
    per_pair, rows = catalog.stack_pair_bytes("hf-peft", "cuda")
    assert rows and per_pair > 0 and "stack hf-peft" in peer.efficiency.label
    assert peer.speed.train_s > ours.speed.train_s


def observations(a: steptime.Constants, b: steptime.Constants) -> list[fit.Observation]:
    """Rows of two devices whose steps the constants `a` and `b` produce exactly."""
    coefficients = [(0.2, 0.01, 0.1, 3000.0), (0.4, 0.02, 0.08, 1000.0), (0.1, 0.005, 0.2, 7000.0)]
    out = []
    for dev, c in (("one", a), ("two", b)):
        for i, k in enumerate(coefficients):
            out.append(fit.Observation(dev, "cuda", f"{dev}{i}", f"file row {i}", k, fit.predict_s(c, k)))
    return out


def test_a_device_in_the_fit_recovers_its_constants_and_left_out_takes_the_others():
    a = steptime.Constants(0.7, 0.35, 0.8, 5e-6)
    b = steptime.Constants(0.5, 0.35, 0.6, 5e-6)
    obs = observations(a, b)
    inside = fit.fit_device(obs, "one")
    assert inside.constants.matmul == pytest.approx(0.7, rel=0.05)
    assert inside.constants.bandwidth == pytest.approx(0.8, rel=0.05)
    assert "matmul" in inside.measured and "attention" not in inside.measured
    assert inside.carried_from == ("two",) and inside.rows == ("file row 0", "file row 1", "file row 2")
    out = fit.fit_device(obs, "one", leave_out=True)
    assert out.measured == () and out.rows == ()
    assert out.constants.matmul == pytest.approx(0.5, rel=0.05)  # device two's, its rows unseen
    err_in = [fit.predict_s(inside.constants, o.coefficients) / o.measured_s - 1 for o in obs if o.device == "one"]
    err_out = [fit.predict_s(out.constants, o.coefficients) / o.measured_s - 1 for o in obs if o.device == "one"]
    assert max(map(abs, err_in)) < 0.03 < 0.1 < max(map(abs, err_out))


def test_a_kind_without_measured_devices_keeps_its_assumed_constants():
    c, used = fit.pooled([], "cpu")
    assert c == fit.ASSUMED["cpu"] and used == ()


def test_fitted_catalog_names_its_rows_and_files_that_exist():
    from pathlib import Path

    data = catalog.read("fitted.yaml")
    repo = Path(__file__).resolve().parents[3]
    assert data["devices"]
    for name, row in data["devices"].items():
        assert set(row["constants"]) == set(steptime.Constants.names())
        assert row["rows"], name
        for src in row["rows"]:
            if src.startswith("benchmarks/"):
                assert (repo / src.split(" ")[0]).exists(), src
    assert data["stacks"]["hf-peft"]["rows"]


def test_plan_prints_the_step_by_part_and_where_its_constants_come_from(capsys):
    argv = ["plan", "--model", "llama-3.2-1b", "--examples", "2000", "--mean-tokens", "600"]
    assert main([*argv, "--gpu", "h200,rtx-4090"]) == 0
    out = capsys.readouterr().out
    # compile: auto resolved per GPU; the step line names the mode the decision chose
    assert "step (tunelab, eager):" in out or "step (tunelab, compiled):" in out
    assert "memory-bound" in out and "attention" in out
    steps = [line for line in out.splitlines() if line.strip().startswith("step (")]
    assert steps and all(line.rsplit("; ", 1)[1].count("-bound") == 1 for line in steps)  # never "memory-bound-bound"
    assert "measured here: matmul" in out  # the H200 has measured rows
    assert "carried over (h200): matmul, attention, bandwidth, launch_s" in out  # the 4090 has none
    assert main([*argv, "--gpu", "h200", "--stack", "hf-peft"]) == 0
    assert "step (hf-peft, eager)" in capsys.readouterr().out


def test_the_head_runs_over_target_positions_and_a_trained_heads_backward_recomputes_its_logits():
    a = one_b()
    t = archmod.adapter_targets(a, "all-linear")

    def step(method, loss_tokens, chunk):
        shape = steptime.Shape(1, 16384, 700.0, False, 2, loss_tokens, chunk)
        return steptime.work(a, methods.get(method), "none", t, 16, False, shape, ridge=1.0)  # every GEMM compute-bound

    # the head's forward and input gradient: 2 x 2 x rows x h x V FLOPs, over the positions with a target only
    half, whole = step("lora", 8192, 256), step("lora", 16384, 256)
    assert whole.matmul_flops - half.matmul_flops == pytest.approx(4 * 8192 * a.hidden * a.vocab)
    # a trained head's backward recomputes the logits and makes the weight gradient over all rows, a vocabulary
    # slice at a time: four head products per target row, and no per-chunk fp32 accumulation, so the traffic
    # does not grow with the chunks; per recomputed logit, 3 x 2 + 24 B
    many, one = step("full", 8192, 256), step("full", 8192, 8192)
    assert many.memory_bytes == pytest.approx(one.memory_bytes)
    assert many.matmul_flops == pytest.approx(one.matmul_flops, rel=1e-3)  # the same products, in slices
    whole = step("full", 16384, 256)
    assert whole.matmul_flops - many.matmul_flops == pytest.approx(4 * 2 * 8192 * a.hidden * a.vocab, rel=1e-3)
    loss_pass = steptime.loss_bytes_per_token(a, 2) * 8192
    assert whole.memory_bytes - many.memory_bytes == pytest.approx(loss_pass + 30 * 8192 * a.vocab)


def test_the_cpu_slot_path_counts_each_slots_whole_square_and_its_written_scores():
    """Equal documents of 10 tokens, rows of 64, micro-batch 2: 6 documents a row, 12 slots of 16 (10 rounded
    up) a micro-batch, each computed whole: 12 x 16² pairs, however the lengths are given."""
    b = workload.Batching(BatchConfig(seq_len=64, micro_batch=2, grad_accum=1, packing=True))
    assumed = workload.build(workload.Lengths(24, 10.0, 5.0, "assumed"), b, 1.0)
    counted = workload.build(workload.Lengths(24, 10.0, 5.0, "test", np.full(24, 10)), b, 1.0)
    for w in (assumed, counted):
        assert (w.epoch.micro_batches, w.epoch.slots, w.epoch.slot_len) == (2, 12, 16)
        assert w.epoch.slot_pairs == w.epoch.scored_pairs == 2 * 12 * 16**2 and w.epoch.masked_pairs == 0
    # Slots longer than the run computes as products (runtime.slot_max_len) run SDPA: no scores written.
    flash = workload.build(workload.Lengths(24, 10.0, 5.0, "test", np.full(24, 10)), replace(b, products_len=8), 1.0)
    assert (flash.epoch.slot_pairs, flash.epoch.scored_pairs) == (2 * 12 * 16**2, 0)
    # The slot path is the CPU's; a GPU's kernels skip the other documents and the causal half.
    from tunelab.plan.estimate import attention_work

    assert attention_work(counted, "auto", "cpu") == (12 * 16**2 / 128, 12 * 16**2 / 128)
    assert attention_work(counted, "auto", "cuda") == (steptime.attention_keys(np.full(24, 10), 10, 64, True), 0.0)
    assert (
        attention_work(replace(counted, batching=replace(b, batch=replace(b.batch, packing=False))), "auto", "cpu")[1]
        == 0.0
    )
    # A micro-batch whose slots would cost more than its rows runs over the rows under a mask: rows x width².
    # Rows of 64: a document of 60 and one of 4, two rows a micro-batch: 4 x 64² > 2 x 64².
    masked = workload.build(workload.Lengths(4, 32.0, 16.0, "test", np.array([60, 4, 60, 4])), b, 1.0)
    assert (masked.epoch.slot_pairs, masked.epoch.masked_pairs) == (0, 2 * 64**2)
    assert attention_work(masked, "auto", "cpu") == (2 * 64**2 / masked.epoch.tokens_padded, 0.0)
    # Written scores cost memory-bound bytes per pair, head and layer; compiled blocks fuse their passes.
    a = resolve_arch("embedded")
    targets = archmod.adapter_targets(a, "all-linear")
    base = steptime.Shape(1, 128, 24.0, False, 2, 64.0)
    pairs = 24.0 * 128 * a.heads * a.layers
    for compiled, ckpt in ((False, False), (True, False), (False, True)):
        shape = replace(base, compiled=compiled)
        plain = steptime.work(a, methods.get("lora"), "none", targets, 8, ckpt, shape, 100.0)
        scored = steptime.work(
            a, methods.get("lora"), "none", targets, 8, ckpt, replace(shape, scored_keys_per_token=24.0), 100.0
        )
        fwd, bwd = steptime.score_bytes_per_pair(compiled)
        assert scored.memory_bytes - plain.memory_bytes == pytest.approx(pairs * (fwd * (2 if ckpt else 1) + bwd))
        assert scored.attention_flops == plain.attention_flops
    assert steptime.score_bytes_per_pair(True)[0] < steptime.score_bytes_per_pair(False)[0]
