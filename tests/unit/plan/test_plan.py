"""`tunelab plan`: the arithmetic pinned against hand counts, and the CLI end to end."""

import dataclasses
import json
import math

import pytest
import torch
from conftest import plan_setup

from tunelab import methods
from tunelab.cli import main
from tunelab.config import BatchConfig, load_config
from tunelab.plan import arch as archmod
from tunelab.plan import calibration, catalog, memory, timing, workload
from tunelab.plan.flops import flops_per_token
from tunelab.sources import resolve_arch

LLAMA2 = "meta-llama/Llama-2-7b-hf"


def plan_json(capsys, *argv) -> list[dict]:
    assert main(["plan", *argv, "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_goat_steps_and_checkpoints():
    cfg = load_config("configs/goat-7b.yaml")
    b = workload.Batching(cfg.batch)
    w = workload.build(workload.assumed_lengths(304_000, 40, 0.3), b, cfg.batch.epochs)
    assert w.optimizer_steps == 2375  # 304,000 / 128
    ck = workload.checkpoints(w.optimizer_steps, cfg.run.save_steps, cfg.run.save_total_limit)
    # saves at steps 50..2350 (train saves before the last step, then a final save): 47 + final
    assert (ck.written, ck.kept, ck.final) == (47, 10, 1)


def test_seed_padded_upper_bound_and_real_padding():
    b = workload.Batching(BatchConfig(seq_len=512, micro_batch=2, grad_accum=4, packing=False))
    w = workload.build(workload.assumed_lengths(10_000, 200, 0.5), b, epochs=3)
    assert w.tokens_upper_bound == 15_360_000  # 10k x 512 x 3, the seed's figure
    assert w.tokens_nonpad == 10_000 * 200 * 3
    assert w.tokens_padded == 10_000 * 200 * 3  # 200 is a multiple of 8: equal lengths pad nothing
    assert w.optimizer_steps == 3 * math.ceil(10_000 / 8)
    packed = workload.build(
        workload.assumed_lengths(10_000, 200, 0.5),
        workload.Batching(BatchConfig(seq_len=512, micro_batch=2, grad_accum=4, packing=True)),
        3,
    )
    # two 200-token examples per 512 row: 5,000 rows x 512 x 3 epochs
    assert packed.tokens_padded == 5_000 * 512 * 3


def test_slot_shape_is_the_longest_slot_of_the_batches_that_pay():
    """collate decides slots per micro-batch and gives a paying one the run's slot count: plan's memory shape is
    what the worst paying batch builds, even where the run's most sequences at its longest would not pay (rows of
    varied length; the embedded model's activations were 36% low from it)."""
    import numpy as np

    from tunelab.data.packing import epoch_micro_batches, layout_from_lengths, slots_pay

    lengths = np.random.default_rng(0).integers(20, 256, 64)
    b = workload.Batching(BatchConfig(seq_len=256, micro_batch=2, grad_accum=1, packing=True))
    counts = workload.epoch_counts(workload.Lengths(64, float(lengths.mean()), 10.0, "t", lengths), b)
    batches = epoch_micro_batches(lengths, 256, 2, True, np.random.default_rng([b.seed, 0]))
    seqs = [[[int(lengths[i]) for i in row] for row in batch] for batch in batches]
    most = max(sum(map(len, s)) for s in seqs)
    assert not slots_pay(most, int(lengths.max()), 2, 256)  # the run-level question says whole rows
    shapes = [
        layout_from_lengths(s, 256, most).gather.shape
        for s in seqs
        if slots_pay(sum(map(len, s)), max(map(max, s)), 2, 256)
    ]
    assert shapes and (counts.slots, counts.slot_len) == max(shapes, key=lambda x: x[1])


def test_flops_llama2_7b_hand_count():
    a = resolve_arch(LLAMA2)
    per_layer = 4 * 4096 * 4096 + 3 * 4096 * 11008
    n = 32 * per_layer + 32000 * 4096
    assert a.matmul_params == n == 6_607_077_376
    assert a.total_params == 6_738_415_616  # + the input embedding (untied)
    attn = 12 * 32 * 32 * 128 * 512
    full = flops_per_token(a, "full", (), 0, 512, grad_ckpt=False)
    assert full.model == 6 * n + attn
    lora = flops_per_token(a, "lora", ("q_proj", "v_proj"), 8, 512, grad_ckpt=True)
    adapters = 32 * 8 * (4096 + 4096) * 2
    assert lora.model == 4 * n + attn + 6 * adapters
    assert lora.recompute == 2 * 32 * per_layer + attn / 3 + 2 * adapters
    assert lora.hardware == lora.model + lora.recompute
    # DoRA with dropout computes q's and v's base products again on the dropped input, and their input gradient.
    dora = flops_per_token(a, "dora", ("q_proj", "v_proj"), 8, 512, grad_ckpt=True, lora_dropout=0.05)
    again = 32 * 2 * (2 * 4096 * 4096)
    assert dora.model == lora.model + 2 * again and dora.recompute == lora.recompute + again
    assert (
        flops_per_token(a, "dora", ("q_proj",), 8, 512, False).model
        == flops_per_token(a, "lora", ("q_proj",), 8, 512, False).model
    )  # without dropout DoRA reuses the base product


def small_arch() -> archmod.Arch:
    return archmod.Arch(
        "toy",
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        head_dim=16,
        intermediate=128,
        vocab=100,
        max_positions=64,
        tied=False,
        source="test",
    )


def setup(**kw):
    """Two micro-batches a step: the first's gradients are alive through the second's backward, so every term these
    hand counts check is at the peak at once (one micro-batch a step: tests/unit/plan/test_plan_moments.py)."""
    return plan_setup(**{"grad_accum": 2, **kw})


def test_memory_hand_count_lora():
    a = small_arch()
    m = memory.breakdown(a, *setup())
    total = a.total_params
    assert total == 2 * (4 * 64 * 64 - 2 * 64 * 32 + 3 * 64 * 128) + 2 * 100 * 64 + 5 * 64
    adapters = 2 * 8 * ((64 + 64) + (64 + 32))
    assert m.weights == total * 2
    assert (m.adapters, m.gradients, m.optimizer_states) == (adapters * 4, adapters * 4, adapters * 8)
    # per token and layer, eager: norms 2x4x64 + MLP 3x2x128 + q/v's shared input 2x64 + A outputs 2x2x8,
    # + attention over whole rows: q, k, v, output 2x(2x64+2x32) + SDPA's log-sum-exp 4x4
    per = 512 + 768 + 128 + 32 + 400
    assert m.activations == 2 * per * 20 + 4 * 64 * 20
    # a whole chunk's fp32 and bf16 logits scratch (2048 rows, however few carry the loss), the gathered hidden
    # states and their gradient
    assert m.logits_loss == 2048 * 100 * (4 + 2) + 2 * 5 * 64 * 2
    capped = memory.breakdown(dataclasses.replace(a, logit_softcap=30.0), *setup())
    assert capped.logits_loss == m.logits_loss + 3 * 4 * 2048 * 100  # tanh(z/c), its square, 1 - that


def test_memory_hand_count_compiled_blocks_with_attention_slots():
    a = small_arch()
    m = memory.breakdown(a, *setup(compiled=True, slots=4, slot_len=8, attention_probs=True))
    # per token and layer: the block's input 2x64 + o_proj's input 2x64 + gate and up 2x2x128 + two 1/rms 2x4
    # + A outputs 2x2x8; per slot position: q, k, v, output 2x(2x64+2x32) + probabilities 2x4x8
    rows, slots = 128 + 128 + 512 + 8 + 32, 384 + 64
    assert m.activations == 2 * (rows * 20 + slots * 4 * 8) + 4 * 64 * 20
    full = memory.breakdown(a, *setup(method="full", targets=(), compiled=True, grad_ckpt=True))
    # the residual stream is fp32 under full fine-tuning: each layer's input 4x64, one layer recomputed
    one_layer = (4 * 64 + 128 + 512 + 8) * 20 + 400 * 20
    assert full.activations == 2 * 4 * 64 * 20 + one_layer + 4 * 64 * 20


def test_memory_hand_count_llama2_qlora_and_full():
    a = resolve_arch(LLAMA2)
    q = memory.breakdown(a, *setup(method="qlora", base_quant="nf4"))
    blocks = 6_476_005_376
    assert q.weights == round(blocks * (0.5 + 1 / 64 + 4 / 16384) + (a.total_params - blocks) * 2)
    f = memory.breakdown(a, *setup(method="full", targets=()))
    embedding_and_head = 2 * 32000 * 4096  # untied: neither is an autocast copy
    assert f.weights == a.total_params * 4 + (a.total_params - embedding_and_head) * 2  # fp32 master + block copies
    assert (f.gradients, f.optimizer_states) == (a.total_params * 4, a.total_params * 8)
    # the LM head's gradient, made in the loss's backward in the weights' dtype (fp32): 5 target rows make one
    # vocabulary slice, the whole head, so its bf16 cast and its bf16 product before widening are head-sized too
    head = 32000 * 4096
    assert f.logits_loss == 2048 * 32000 * (4 + 2) + 2 * 5 * 4096 * 2 + head * (4 + 2 + 2)
    z3 = memory.breakdown(a, *setup(method="full", targets=(), sharding="zero3", world=4))
    assert z3.optimizer_states == a.total_params * 2 and z3.gradients == a.total_params
    # the whole head's gradient, until the root's reduce-scatter; FSDP's gathered head is bf16 already: no copy
    assert z3.logits_loss == f.logits_loss - head * 2


def test_zero3_counts_the_gathered_root_unit():
    """tunelab's FSDP root (embeddings, final norm, LM head) stays gathered for the whole step, beside one
    gathered decoder layer. Llama-2 7B by hand: 32000 x 4096 embeddings and head, a 4096 final norm; a layer's
    linears are 4 x 4096² + 3 x 4096 x 11008."""
    a = resolve_arch(LLAMA2)
    root = 2 * 32000 * 4096 + 4096
    layer = 4 * 4096**2 + 3 * 4096 * 11008
    assert memory.root_params(a) == root
    full = memory.breakdown(a, *setup(method="full", targets=(), sharding="zero3", world=4))
    assert full.weights == round(a.total_params * 4 / 4 + (layer + root) * 2)  # gathered in bf16, no autocast
    lora = memory.breakdown(a, *setup(sharding="zero3", world=4))
    assert lora.weights == round(a.total_params * 2 / 4 + (layer + root) * 2)
    assert lora.gradients == round(memory.trainable_params(a, *setup()) * 4 / 4)  # no gradient for the frozen root


def test_max_micro_batch_is_largest_that_fits():
    a = resolve_arch(LLAMA2)
    s = setup(row_len=512, loss_rows=256)
    cap = 24 * 2**30
    b = memory.max_micro_batch(a, *s, cap, loss_per_row=128)

    assert memory.breakdown(a, *s.but(micro_batch=b, loss_rows=128 * b)).total <= cap
    assert memory.breakdown(a, *s.but(micro_batch=b + 1, loss_rows=128 * (b + 1))).total > cap


def test_catalog_rows_have_sources_and_dense_peaks():
    for gid in catalog.gpu_ids():
        g = catalog.gpu(gid)
        assert g.source and g.peak_flops > 0
    assert catalog.gpu("h100-sxm").peak_flops == 989e12  # dense, not the 1979 sparse figure
    aws = [p for p in catalog.prices("h100-sxm") if p.provider == "aws-p5.48xlarge"][0]
    assert (aws.price_per_hour, aws.gpus_per_instance) == (98.32, 8)
    # With ECC on an L40S shows 45 GiB of its marketed 48: plan's fit check takes what the device reports.
    assert catalog.gpu("l40s").memory_bytes == 46068 * 2**20 < 48 * 2**30
    rows = catalog.read("gpus.yaml")["gpus"]
    assert all(row.get("memory_source") for row in rows.values() if "memory_mib" in row)


@pytest.mark.parametrize("gpus, instances", [(1, 1), (8, 1), (9, 2)])
def test_cost_pays_for_whole_instances(gpus, instances):
    """An 8-GPU instance costs its whole price for a 1-GPU run: no provider rents an eighth of one."""
    aws = [p for p in catalog.prices("h100-sxm") if p.provider == "aws-p5.48xlarge"][0]
    assert aws.instances(gpus) == instances
    assert timing.cost(2.0, aws.price_per_hour, aws.instances(gpus)) == pytest.approx(2.0 * 98.32 * instances)


def test_registry_covers_issue_models():
    for name in [
        "meta-llama/Llama-2-13b-hf",
        "meta-llama/Llama-2-70b-hf",
        "meta-llama/Llama-3.1-8B",
        "meta-llama/Llama-3.1-70B",
        "meta-llama/Llama-3.2-1B",
        "meta-llama/Llama-3.2-3B",
        "mistralai/Mistral-7B-v0.1",
        "Qwen/Qwen2.5-0.5B",
        "Qwen/Qwen2.5-7B",
        "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
        "google/gemma-2-2b",
        "google/gemma-2-9b",
        "google/gemma-3-1b-it",
        "Qwen/Qwen2.5-1.5B",
        "Qwen/Qwen3-8B",
        "mistralai/Mistral-7B-v0.3",
        "microsoft/Phi-3-mini-4k-instruct",
        "HuggingFaceTB/SmolLM2-135M",
        "HuggingFaceTB/SmolLM2-360M",
        "HuggingFaceTB/SmolLM2-1.7B",
    ]:
        assert resolve_arch(name).total_params > 0
    assert round(resolve_arch("meta-llama/Llama-3.1-8B").total_params / 1e6) == 8030


@pytest.mark.parametrize(
    "name, extra_per_layer, published",
    [
        # Released checkpoints' parameter counts; plan's formula counts two RMSNorms per block, so each family's
        # other norms are added: Gemma-2/3's post-attention and post-MLP norms, Gemma-3's and Qwen3's q/k norms.
        ("microsoft/Phi-3-mini-4k-instruct", lambda a: 0, 3_821_079_552),
        ("google/gemma-2-9b", lambda a: 2 * a.hidden, 9_241_705_984),
        ("google/gemma-3-1b-pt", lambda a: 2 * a.hidden + 2 * a.head_dim, 999_885_952),
        ("Qwen/Qwen3-8B", lambda a: 2 * a.head_dim, 8_190_735_360),
        ("mistralai/Mistral-7B-v0.3", lambda a: 0, 7_248_023_552),
    ],
)
def test_family_rows_count_the_released_parameters(name, extra_per_layer, published):
    a = resolve_arch(name)
    assert a.total_params + a.layers * extra_per_layer(a) == published


def test_calibration_roundtrip_and_use(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNELAB_CACHE", str(tmp_path))
    key = calibration.device_key("NVIDIA H100 80GB HBM3")
    assert key == "nvidia-h100-80gb-hbm3" and calibration.load_calibration(key) is None
    rec = calibration.CalibrationRecord(key, "NVIDIA H100 80GB HBM3", peak_flops=8e14, efficiency={"lora": 0.52})
    calibration.save_calibration(rec)
    back = calibration.load_calibration(key)
    assert back.efficiency == {"lora": 0.52} and back.created


def test_matmul_probe_is_short_and_positive():
    import time

    import torch

    from tunelab import probe

    start = time.perf_counter()
    flops, n = probe.measure_matmul_peak(torch.float32, torch.device("cpu"), seconds=0.2, max_n=512)
    assert flops > 1e8 and probe.MIN_N <= n <= 512
    assert time.perf_counter() - start < 5  # sized to the budget: a few windows, not minutes


def test_matmul_probe_stays_small_where_a_product_is_slow(monkeypatch):
    """An emulated dtype (bf16 on a CPU without bf16 units) must not grow the probe to minutes: the size stops
    doubling once the next product would not fit twice into a window."""
    import torch

    from tunelab import probe

    sizes = []

    def slow(n, dtype, device):
        sizes.append(n)
        return n**3 * 0.5e-9, torch.empty(n, n), torch.empty(n, n)  # 4 GFLOP/s: 256³ 8 ms, 512³ 67 ms, 1024³ 0.54 s

    monkeypatch.setattr(probe, "_time_one", slow)
    monkeypatch.setattr(probe.torch, "matmul", lambda a, b: time_passes(a, b))
    clock = [0.0]

    def time_passes(a, b):
        clock[0] += a.shape[0] ** 3 * 0.5e-9

    monkeypatch.setattr(probe.time, "perf_counter", lambda: clock[0])
    flops, n = probe.measure_matmul_peak(torch.bfloat16, torch.device("cpu"), seconds=2.0)
    assert sizes == [256, 512] and n in (256, 512)  # 1024³ would not fit twice into a 0.25 s window
    assert flops == pytest.approx(4e9, rel=1e-6)
    assert clock[0] < 3.0  # the windows took about the budget


def test_cli_json_fields(capsys):
    (rec,) = plan_json(
        capsys, "--config", "configs/goat-7b.yaml", "--examples", "304000", "--mean-tokens", "40", "--gpu", "a100-80gb"
    )
    for key in [
        "tokens_per_s",
        "time_s",
        "peak_memory_bytes",
        "memory_breakdown",
        "fits",
        "max_micro_batch",
        "optimizer_steps",
        "checkpoints_written",
        "tokens_total_nonpad",
        "tokens_total_padded",
        "flops_per_token",
        "cost_usd",
    ]:
        assert key in rec
    assert rec["optimizer_steps"] == 2375 and rec["checkpoints_written"] == 47
    assert rec["time_s"] == pytest.approx(rec["train_s"] + sum(rec["overheads_s"].values()))
    # the A100 has no measured rows: its step constants are carried over from the measured GPUs, and it says so
    assert any("carried over" in a for a in rec["assumptions"])
    assert set(rec["step_s"]) == {"matmul_s", "attention_s", "memory_s", "fixed_s"}


def test_cli_several_gpus_multi_gpu_and_price_override(capsys):
    recs = plan_json(
        capsys,
        "--model",
        LLAMA2,
        "--method",
        "full",
        "--examples",
        "1000",
        "--gpu",
        "h100-sxm,rtx-4090",
        "--gpus",
        "4",
        "--price-per-hour",
        "2.0",
    )
    assert [r["gpu"] for r in recs] == ["h100-sxm", "rtx-4090"]
    multi = {m["sharding"]: m for m in recs[0]["multi_gpu"]}
    assert multi["zero3"]["peak_memory_bytes"] < multi["zero2"]["peak_memory_bytes"] < multi["ddp"]["peak_memory_bytes"]
    assert not recs[1]["fits"]  # full fine-tuning of 7B on 24 GB
    # Loading for FSDP: every parameter as an fp32 master weight, in the main process's CPU memory.
    from tunelab.plan.arch import from_registry

    assert multi["zero3"]["host_load_bytes"] == 4 * from_registry(LLAMA2).total_params
    assert "host_load_bytes" not in multi["ddp"]
    assert recs[0]["cost_usd"] == {"user": pytest.approx(recs[0]["time_s"] / 3600 * 2.0, abs=0.01)}


def test_cli_says_what_loading_for_fsdp_takes_in_cpu_memory(capsys):
    assert main(["plan", "--model", LLAMA2, "--examples", "1000", "--gpu", "h100-sxm", "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    from tunelab.plan.arch import from_registry

    lora = 2 * from_registry(LLAMA2).total_params / 2**30  # the bf16 base as read; adapters are small
    assert (
        f"x8 zero3 with FSDP (fsdp2.yaml): CPU memory to load {lora:.2f} GiB on the main process, which sends the "
        f"shards; {8 * lora:.2f} GiB if every process reads the weights"
    ) in out


def test_cli_markdown(capsys):
    assert (
        main(
            [
                "plan",
                "--config",
                "configs/llama2-7b-lora.yaml",
                "--examples",
                "10000",
                "--mean-tokens",
                "512",
                "--gpu",
                "rtx-5090,rtx-pro-6000,h100-sxm,a100-80gb",
                "--format",
                "md",
            ]
        )
        == 0
    )
    md = capsys.readouterr().out
    for section in [
        "## GPU comparison",
        "## Runtime scenarios",
        "## Scaling factors",
        "## Recommendations",
        "## Assumptions",
    ]:
        assert section in md
    assert "15,360,000" in md and "carried over" in md


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpu", "h100"], "known: rtx-2080-ti"),
        (["--model", "nobody/nothing-7b"], "Llama-2-7b-hf"),
        (["--micro-batch", "0"], "micro_batch must be at least 1"),
        (["--model", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "--seq-len", "4096"], "maximum of 2048"),
        (["--examples", "0"], "--examples must be at least 1"),
    ],
)
def test_cli_errors_are_one_line(capsys, argv, message):
    base = {"--model": LLAMA2, "--examples": "10"}
    args = list(argv)
    for flag, value in base.items():
        if flag not in args:
            args += [flag, value]
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_cli_needs_a_workload(capsys):
    assert main(["plan", "--model", LLAMA2]) == 2
    assert "--examples" in capsys.readouterr().err


def test_fixed_costs_come_from_the_catalog_per_device_type():
    """Disk speeds and compile time are catalog rows (gpus.yaml), the compile time per device type."""
    table = catalog.read("gpus.yaml")
    read_bps, write_bps = table["disk"]["read_bps"], table["disk"]["write_bps"]
    cuda = timing.overheads(3 * 10**9, 2, 10**9, 10**8, True, "cuda")
    cpu = timing.overheads(3 * 10**9, 2, 10**9, 10**8, True, "cpu")
    eager = timing.overheads(3 * 10**9, 2, 10**9, 10**8, False, "cuda")
    assert cuda.model_load_s == pytest.approx(3e9 / read_bps)
    assert cuda.checkpoint_s == pytest.approx(2.1e9 / write_bps)
    assert (cuda.compile_s, cpu.compile_s, eager.compile_s) == (
        table["compile_s"]["cuda"],
        table["compile_s"]["cpu"],
        0,
    )
    assert cuda.compile_s != cpu.compile_s


@pytest.mark.parametrize(
    ("device_type", "precision", "cpu", "vendor", "cls"),
    [
        ("cuda", "bf16", "", "", "probe-gpu"),
        ("cpu", "fp32", "amx", "", "cpu-fp32"),
        ("cpu", "fp32", "amx", "intel", "cpu-fp32-intel"),
        ("cpu", "fp32", "fp32-only", "amd", "cpu-fp32-amd"),
        ("cpu", "bf16", "amx", "intel", "cpu"),
        ("cpu", "bf16", "avx512-bf16", "", "cpu-avx512-bf16"),
        ("cpu", "bf16", "avx512-bf16", "amd", "cpu-avx512-bf16-amd"),
        ("cpu", "bf16", "avx512-bf16", "intel", "cpu-avx512-bf16-intel"),
        ("cpu", "bf16", "fp32-only", "amd", "cpu"),
    ],
)
def test_local_class_follows_the_units_that_do_the_matmuls(device_type, precision, cpu, vendor, cls):
    assert catalog.local_class(device_type, precision, cpu, vendor) == cls
    gpu = catalog.Gpu("local", "x", 2**34, 0.0, 1e12, precision == "bf16", cls, source="test")
    assert gpu.device_type == device_type


def test_short_ids_name_catalog_models(tmp_path, monkeypatch):
    full = archmod.from_registry("meta-llama/Llama-3.1-8B")
    short = archmod.from_registry("LLAMA-3.1-8b")
    assert short.name == "meta-llama/Llama-3.1-8B" and short.total_params == full.total_params
    assert archmod.from_registry("llama-3.1-8b-instruct").name == "meta-llama/Llama-3.1-8B-Instruct"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama-3.1-8b").mkdir()  # a local directory of that name is the user's, not the catalog's
    assert archmod.from_registry("llama-3.1-8b") is None


@pytest.mark.parametrize(
    ("micro_batch", "accum", "largest", "split"),
    [(8, 1, 5, (4, 2)), (16, 2, 6, (4, 8)), (8, 1, 1, (1, 8)), (6, 1, 5, (3, 2)), (8, 1, 0, None)],
)
def test_accumulation_split_keeps_rows_per_step(micro_batch, accum, largest, split):
    from tunelab.plan.estimate import accumulation_split

    assert accumulation_split(micro_batch, accum, largest) == split


def test_a_run_that_does_not_fit_is_offered_a_smaller_micro_batch_at_equal_rows(capsys):
    argv = [
        "--model",
        "llama-3.1-8b",
        "--examples",
        "50000",
        "--mean-tokens",
        "500",
        "--seq-len",
        "2048",
        "compile=false",
    ]
    (rec,) = plan_json(capsys, *argv, "--gpu", "h100-sxm", "--micro-batch", "8")
    assert not rec["fits"] and rec["max_micro_batch"] == 5
    assert main(["plan", *argv, "--gpu", "h100-sxm", "--micro-batch", "8"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "try: micro-batch" in x)
    # smaller micro-batches launch more kernels per token: the step model prices the split (costs, not saves)
    assert "micro-batch 8 -> 4, grad_accum 1 -> 2" in line and "(costs " in line and "does not fit" not in line
    (fitted,) = plan_json(capsys, *argv, "--gpu", "h100-sxm", "--micro-batch", "4", "--grad-accum", "2")
    assert fitted["fits"] and fitted["optimizer_steps"] == rec["optimizer_steps"]
    assert rec["time_s"] < fitted["time_s"] < 1.1 * rec["time_s"]


def test_the_method_key_follows_the_base_the_adapters_train_over():
    """LoRA over an nf4 base is a QLoRA run whatever the config calls it; DoRA over a quantized base is keyed
    apart from DoRA over a 16-bit one."""
    assert methods.get("lora").key("nf4") == "qlora" and methods.get("dora").key("int8") == "dora-int8"
    assert methods.get("qlora").key("nf4") == "qlora" and methods.get("full").key("none") == "full"


def test_plan_local_measures_this_machine_in_the_runs_precision(capsys, monkeypatch):
    """The local probe runs in the config's precision, so an fp32 run is planned at the fp32 rate and class,
    fp16 on a CPU fails as train fails, and several processes on one CPU are refused (they share its cores)."""
    seen = []
    monkeypatch.setattr("tunelab.plan.calibration.load_calibration", lambda key: None)
    monkeypatch.setattr("tunelab.probe.matmul_peak", lambda dtype, dev: (seen.append(dtype), (1e12, 256))[1])
    assert main(["plan", "--model", "smollm2-135m", "--examples", "100", "--gpu", "local", "--precision", "fp32"]) == 0
    assert seen == [torch.float32] and "for class cpu-fp32" in capsys.readouterr().out
    assert main(["plan", "--model", "smollm2-135m", "--examples", "100", "--gpu", "local", "--precision", "fp16"]) == 2
    assert "precision fp16 needs a CUDA GPU" in capsys.readouterr().err
    assert main(["plan", "--model", "smollm2-135m", "--examples", "100", "--gpu", "local", "--gpus", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "share this machine's cores" in err[0]


def test_a_config_json_without_the_shape_is_refused_not_filled_with_a_default_7b(tmp_path, capsys):
    """LlamaConfig fills every key the file omits with a 7B's value; plan must not present that as the file's."""
    folder = tmp_path / "partial"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    assert main(["plan", "--model", str(folder), "--examples", "10"]) == 2
    err = capsys.readouterr().err
    assert "its config lacks hidden_size, num_hidden_layers" in err and len(err.strip().splitlines()) == 1


def test_gemma2_rows_and_configs_carry_their_final_logit_softcap():
    assert resolve_arch("google/gemma-2-2b").logit_softcap == 30.0
    assert resolve_arch(LLAMA2).logit_softcap == 0.0
    from transformers import Gemma2Config

    cfg = Gemma2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, vocab_size=100
    )
    assert archmod.from_hf_config("g", cfg, "test").logit_softcap == cfg.final_logit_softcapping == 30.0


@pytest.mark.parametrize(("examples", "chosen"), [(300000, True), (200, False)])
def test_plan_resolves_compile_auto_as_the_run_does(capsys, examples, chosen):
    """`compile: auto` (the default): compiled blocks where the predicted eager time pays the catalog's compile
    cost back, and the estimate is then the compiled one (its compile overhead included)."""
    (rec,) = plan_json(
        capsys, "--model", LLAMA2, "--examples", str(examples), "--mean-tokens", "200", "--gpu", "h100-sxm"
    )
    assert rec["compile"]["mode"] == "auto" and rec["compile"]["chosen"] is chosen
    assert rec["assumptions"][0] == rec["compile"]["why"]
    assert (rec["overheads_s"]["compile"] > 0) is chosen


@pytest.mark.parametrize("grad_ckpt", [False, True])
def test_longest_seq_len_is_the_last_multiple_of_128_that_fits_and_offload_raises_it(grad_ckpt):
    arch = resolve_arch("llama-3.1-8b")
    s = setup(micro_batch=1, attention="flex", grad_ckpt=grad_ckpt, targets=tuple(arch.linears()))
    capacity = 80 * 2**30

    def peak(t, offload=False):
        return memory.breakdown(arch, *s.but(row_len=t, loss_rows=t // 2, offload=offload)).total

    longest = memory.max_seq_len(arch, *s, capacity, 0.5)
    assert longest % 128 == 0 and peak(longest) <= capacity < peak(longest + 128)
    offloaded = memory.max_seq_len(arch, *s.but(offload=True), capacity, 0.5)
    assert offloaded > longest and peak(offloaded, True) <= capacity < peak(offloaded + 128, True)
    # the device keeps memory.OFFLOAD_LAYERS layers' activations (with grad_ckpt: inputs) instead of all 32's,
    # the host a copy of each layer's
    on, off = (memory.activation_bytes(arch, *s.but(row_len=8192, offload=o)) for o in (True, False))
    assert on < (off / 2 if grad_ckpt else off / 8)
    assert memory.offloaded_bytes(arch, *s.but(row_len=8192, offload=True)) > 0
    assert memory.offloaded_bytes(arch, *s.but(row_len=8192)) == 0


def test_hf_peft_holds_the_whole_vocabulary_logits_in_fp32():
    """transformers' loss upcasts every position's logits and keeps fp32 log-probabilities, and its backward
    starts with three fp32 tensors a logit: a 152k vocabulary at 8,192 positions is gigabytes that tunelab's
    chunked head over the targets never holds."""
    from tunelab import api

    def logits(stack):
        (r,) = api.estimate(
            None,
            "model=Qwen/Qwen2.5-7B",
            "method=lora",
            "seq_len=8192",
            "micro_batch=1",
            "grad_ckpt=true",
            gpu="h100-sxm",
            examples=200,
            mean_tokens=8192,
            stack=stack,
        )
        return r.single.memory.logits_loss, r.single.layout.row_len

    hf, width = logits("hf-peft")
    own, _ = logits("tunelab")
    assert hf == pytest.approx(width * 152064 * (4 + 4 + 4))
    assert hf > 10 * 2**30 > 20 * own


def test_hf_peft_runs_the_head_and_its_loss_over_every_fed_position():
    """tunelab gathers the target positions before its head; the HF stack projects and scores every fed one, its
    padding included, and plan's step (and the fit of the stack's residual factor) counts them so."""
    from tunelab.plan.hfstack import HfStack
    from tunelab.plan.job import Job

    assert Job(stack="hf-peft", hf=HfStack()).head_positions(fed=4096.0, targets=1024.0) == 4096.0
    assert Job().head_positions(fed=4096.0, targets=1024.0) == 1024.0


def test_a_time_limit_predicts_the_steps_that_run_before_it(capsys):
    args = ("--config", "configs/goat-7b.yaml", "--examples", "304000", "--mean-tokens", "40", "--gpu", "a100-80gb")
    (whole,) = plan_json(capsys, *args)
    limit_min = whole["train_s"] / 2 / 60
    (cut,) = plan_json(capsys, *args, f"max_minutes={limit_min}")
    compile_s = whole["overheads_s"]["compile"]
    step_s = whole["train_s"] / whole["optimizer_steps"]
    assert cut["time_limited_from_steps"] == whole["optimizer_steps"] == 2375
    assert cut["optimizer_steps"] == math.floor((limit_min * 60 - compile_s) / step_s)
    assert cut["train_s"] + compile_s <= limit_min * 60
    assert cut["cost_usd"] and all(cut["cost_usd"][k] < v for k, v in whole["cost_usd"].items())
    assert "time_limited_from_steps" not in whole
    assert main(["plan", *args, f"max_minutes={limit_min}"]) == 0
    assert f"ends training after {cut['optimizer_steps']:,} of the schedule's 2,375 steps" in capsys.readouterr().out
    # A limit the run ends within changes nothing.
    (roomy,) = plan_json(capsys, *args, f"max_minutes={whole['train_s']}")
    assert roomy["optimizer_steps"] == 2375 and "time_limited_from_steps" not in roomy


def test_steps_within_a_limit():
    assert timing.steps_within(0, 100, 1000.0, 100.0) == 100  # no limit
    assert timing.steps_within(2000, 100, 1000.0, 100.0) == 100
    assert timing.steps_within(550, 100, 1000.0, 100.0) == 50  # 9 s a step after 100 s of compile
    assert timing.steps_within(50, 100, 1000.0, 100.0) == 1  # the first step always runs
