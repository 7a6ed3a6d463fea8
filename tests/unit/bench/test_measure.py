"""`tunelab bench`: results DB, sweep grid, peak matching, MFU/HFU, calibration fit, and the CLI end to end on
a tiny random Llama (each measured point runs train() in a fresh process: bench/points.in_fresh_process)."""

import csv
import io
import json
from dataclasses import replace

import pytest
from conftest import write_jsonl

from tunelab.bench import calibrate, loops, measure, store
from tunelab.cli import main
from tunelab.commands import bench as command
from tunelab.errors import TunelabError
from tunelab.plan import catalog
from tunelab.plan.calibration import load_calibration, save_calibration
from tunelab.plan.flops import FlopsPerToken
from tunelab.recipes.predict import local_prediction


def test_store_roundtrip_filters_and_export(tmp_path):
    db = tmp_path / "r" / "bench.sqlite"
    a = store.insert(
        db, {"kind": "tunelab", "method": "lora", "packing": True, "data": {"examples": 3}, "tokens_nonpad_per_s": 10.5}
    )
    b = store.insert(db, {"kind": "hf-trainer", "method": "lora", "packing": False})
    assert b == a + 1
    rows = store.query(db, kind="tunelab")
    assert len(rows) == 1 and rows[0]["data"] == {"examples": 3} and rows[0]["packing"] is True
    assert rows[0]["timestamp"].endswith("Z") and rows[0]["tokens_nonpad_per_s"] == 10.5
    assert [r["kind"] for r in store.query(db, method="lora")] == ["tunelab", "hf-trainer"]
    assert store.query(tmp_path / "missing.sqlite") == []
    parsed = list(csv.DictReader(io.StringIO(store.export(store.query(db), "csv"))))
    assert list(parsed[0]) == list(store.COLUMNS) and json.loads(parsed[0]["data"]) == {"examples": 3}
    assert json.loads(store.export(store.query(db), "json"))[1]["kind"] == "hf-trainer"


def test_store_refuses_unknown_keys_and_missing_kind(tmp_path):
    with pytest.raises(ValueError, match="tokens_per_sec"):
        store.insert(tmp_path / "db.sqlite", {"kind": "tunelab", "tokens_per_sec": 1.0})
    with pytest.raises(ValueError, match="kind"):
        store.insert(tmp_path / "db.sqlite", {"method": "lora"})
    with pytest.raises(ValueError):
        store.query(tmp_path / "db.sqlite", nope=1)


def test_sweep_grid_labels_and_errors():
    points = loops.sweep_points(["micro_batch=4,8", "packing=true,false"])
    assert [p[0] for p in points] == [
        "micro_batch=4 packing=true",
        "micro_batch=4 packing=false",
        "micro_batch=8 packing=true",
        "micro_batch=8 packing=false",
    ]
    assert points[1][1] == ["micro_batch=4", "packing=false"]
    assert loops.sweep_points([]) == [("", [])]
    with pytest.raises(TunelabError, match="KEY=V1"):
        loops.sweep_points(["micro_batch"])
    assert command.output_dir(["lr=1", "output_dir=/x/y"]) == "/x/y"
    assert command.output_dir([]) == command.DEFAULT_OUTPUT


@pytest.mark.parametrize(
    "name,memory_gib,expected",
    [
        ("NVIDIA H100 80GB HBM3", 80, "h100-sxm"),
        ("NVIDIA H100 PCIe", 80, "h100-pcie"),
        ("NVIDIA H100 NVL", 94, "h100-nvl"),
        ("NVIDIA A100-SXM4-80GB", 80, "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", 40, "a100-40gb"),
        ("NVIDIA A100 80GB PCIe", 80, "a100-80gb-pcie"),
        ("NVIDIA GeForce RTX 4090", 24, "rtx-4090"),
        ("NVIDIA H200", 141, "h200"),
        ("Tesla T4", 16, None),
    ],
)
def test_catalog_match_of_torch_device_names(name, memory_gib, expected):
    row = catalog.match_gpu(name, memory_gib * 2**30)
    assert (row.id if row else None) == expected


def test_mfu_hfu_and_efficiency_follow_metrics_md():
    f = FlopsPerToken(dense=600.0, attention=100.0, adapters=0.0, recompute=300.0)
    assert measure.mfu(10.0, f, 1e4) == pytest.approx(10 * 700 / 1e4)
    assert measure.hfu(10.0, f, 1e4) == pytest.approx(10 * 1000 / 1e4)
    assert measure.achieved_efficiency(12.0, f.hardware, 1e4) == pytest.approx(12 * 1000 / 1e4)
    # the useful MFU counts attention document-causal: 25 of the whole row's 100
    g = FlopsPerToken(dense=600.0, attention=100.0, adapters=0.0, recompute=0.0, attention_useful=25.0)
    assert measure.useful_mfu(10.0, g, 1e4) == pytest.approx(10 * 625 / 1e4)
    assert store.mfu_text({"mfu": 0.471, "mfu_useful": 0.43}) == "43.0% (47.1% whole row)"
    assert store.mfu_text({"mfu": 0.2}) == "20.0%"  # a record from before the useful figure


def test_fit_keeps_achieved_rates_of_methods_not_remeasured():
    f = FlopsPerToken(dense=1e9, attention=0.0, adapters=0.0, recompute=0.0)
    peak = measure.Peak(2e12, "bf16", "probe", {"bf16": 2e12})
    old = calibrate.fit("k", "cpu", measure.Peak(1e12, "bf16", "old", {}), [calibrate.Point("full", 100.0, f, 10, 4)])
    rec = calibrate.fit(
        "k", "cpu", peak, [calibrate.Point("lora", 500.0, f, 900, 600), calibrate.Point("full", 300.0, f, 5, 1)], old
    )
    assert rec.efficiency["lora"] == pytest.approx(500 * 1e9 / 2e12)
    assert rec.efficiency["full"] == pytest.approx(300 * 1e9 / 2e12)  # re-measured: the new figure wins
    assert rec.runtime_overhead_bytes == 300  # from the first point (the config's method)
    kept = calibrate.fit("k", "cpu", peak, [calibrate.Point("lora", 500.0, f, 900, 600)], old)
    assert kept.efficiency["full"] * peak.flops == pytest.approx(old.efficiency["full"] * 1e12)


@pytest.fixture
def bench_args(tiny_model_dir, addition_rows, tmp_path):
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows * 4)
    return [
        f"model={tiny_model_dir}",
        f"data.path={data}",
        "data.template=compact",
        "seq_len=64",
        "micro_batch=2",
        "precision=fp32",
        f"output_dir={tmp_path / 'bench'}",
    ]


def assert_window_counts(rec: dict, max_padded: int) -> None:
    """Window rates are whole token counts over the window's seconds: padded >= non-padding > loss tokens, and
    at most `max_padded` tokens fed per window step."""
    counts = [rec[f"tokens_{k}_per_s"] * rec["steady_window_s"] for k in ("padded", "nonpad", "loss")]
    assert counts == pytest.approx([round(c) for c in counts], abs=1e-6)
    padded, nonpad, loss = (round(c) for c in counts)
    assert rec["steps"] * max_padded >= padded >= nonpad > loss > 0


@pytest.mark.slow
def test_bench_sweep_json_stores_every_point_and_exports(bench_args, tiny_model_dir, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).parameters())
    assert (
        main(["bench", "sweep", *bench_args, "--steps", "2", "--warmup", "1", "--axis", "micro_batch=2,4", "--json"])
        == 0
    )
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["micro_batch"] for x in lines] == [2, 4]
    for x in lines:
        assert x["steps"] == 2  # the window's steps, after the warm-up step
        assert_window_counts(x, max_padded=x["micro_batch"] * 64)
        assert x["mfu"] == pytest.approx(x["tokens_nonpad_per_s"] * x["model_flops_per_token"] / x["device_peak_flops"])
        assert x["hfu"] == pytest.approx(x["mfu"])  # no gradient checkpointing: nothing recomputed
        assert 0 < x["mfu_useful"] < x["mfu"]  # documents shorter than the row: less attention than the row's
        assert set(x["peak_probes"]) == {"bf16", "fp32"} and x["device_peak_flops"] == x["peak_probes"]["fp32"]
        # A tiny model can peak within memory this process already holds (tests/unit/bench/test_peers.py), so the
        # peak above the start may be 0; the absolute peak holds at least the model's own fp32 weights.
        assert x["peak_memory_absolute_bytes"] >= 4 * params and x["peak_memory_bytes"] >= 0
        assert x["predicted"]["peak_memory_bytes"] >= 4 * params
        assert "step model" in x["predicted"]["source"]
    db = tmp_path / "bench" / "bench.sqlite"
    rows = store.query(db, kind="tunelab")
    assert [r["label"] for r in rows] == ["micro_batch=2", "micro_batch=4"]
    assert rows[0]["torch_version"] and rows[0]["data"]["tokens_loss"] > 0 and rows[0]["config"]["save_steps"] == 0
    out = tmp_path / "exp" / "runs.csv"
    assert main(["bench", "export", "csv", "--db", str(db), "--out", str(out)]) == 0
    assert len(list(csv.DictReader(out.open()))) == 2


@pytest.mark.slow
def test_calibrate_writes_a_record_plan_reads(bench_args, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TUNELAB_CACHE", str(tmp_path / "cache"))
    bench_args = [*bench_args, "compile=false"]  # one mode: the record scales eager and compiled steps apart
    assert (
        main(["bench", "calibrate", *bench_args, "--methods", "lora", "--steps", "2", "--warmup", "1", "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    key = out["calibration"]["device_key"]
    record = load_calibration(key)
    run = out["runs"][0]
    assert record.efficiency["lora"] == pytest.approx(
        run["tokens_padded_per_s"] * run["hardware_flops_per_token"] / record.peak_flops
    )
    # No record existed before, so plan's prediction carried the catalog's CPU overhead; the record keeps the
    # measured peak minus the model without it.
    overhead = run["peak_memory_bytes"] - run["predicted"]["peak_memory_bytes"] + catalog.runtime_overhead("cpu")
    assert record.runtime_overhead_bytes == overhead
    # plan --gpu local now predicts the measured step: the step model's times the measured/modeled ratio.
    cfg = command.point_config(command_args(bench_args), [], tmp_path / "p")
    prediction = local_prediction(cfg)
    key = calibrate.scale_key("lora", run["compile"]["chosen"])  # eager and compiled steps are scaled apart
    assert record.step_scale[key] == pytest.approx(run["step_time_median_s"] / prediction.model_step_s, rel=1e-6)
    assert prediction.step.total == pytest.approx(run["step_time_median_s"], rel=1e-6)
    assert "calibrated for lora" in prediction.efficiency.label and "step model x" in prediction.efficiency.label
    assert prediction.device.gpu.peak_flops == record.peak_flops  # plan reads the record's peak, no new probe
    # and its bandwidth: the copy probe of the calibration, which the run's record carries too
    assert record.bandwidth_bps == run["device_bandwidth_bps"] > 0
    assert prediction.device.gpu.bandwidth_gbs * 1e9 == pytest.approx(record.bandwidth_bps)
    # Another shape keeps what the model knows of it: the same factor on its own modeled step.
    other = local_prediction(command.point_config(command_args([*bench_args, "micro_batch=1"]), [], tmp_path / "q"))
    assert other.step.total == pytest.approx(other.model_step_s * record.step_scale[key], rel=1e-9)
    assert other.model_step_s != prediction.model_step_s
    # A record of the older form (a flat efficiency only) still calibrates: peak x efficiency / hardware FLOPs.
    save_calibration(replace(record, step_scale={}))
    flat = local_prediction(cfg)
    assert flat.speed.tokens_per_s == pytest.approx(run["tokens_padded_per_s"], rel=1e-6)


def command_args(overrides):
    import argparse

    return argparse.Namespace(config=None, overrides=overrides)


def test_bench_errors_before_measuring(bench_args, capsys):
    assert main(["bench", "run", *bench_args, "--steps", "100000"]) == 2
    assert "fewer than warm-up + steps" in capsys.readouterr().err
    assert main(["bench", "sweep", *bench_args, "--axis", "micro_batch=0,2"]) == 2
    assert main(["bench", "export", "json", "--db", "/nonexistent/x.sqlite"]) == 2


@pytest.mark.slow
def test_bench_peer_interleaves_runs_and_prints_ratios(bench_args, tmp_path, capsys):
    assert (
        main(
            [
                "bench",
                "peers",
                "hf-trainer-tuned",
                *bench_args,
                "--steps",
                "2",
                "--warmup",
                "1",
                "--rounds",
                "1",
                "--json",
            ]
        )
        == 0
    )
    (row,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert row["kind"] == "hf-trainer-tuned" and row["runs"] == 1 and row["tunelab_runs"] == 1
    assert row["tokens_nonpad_ratio"] == pytest.approx(row["tunelab_tokens_nonpad_per_s"] / row["tokens_nonpad_per_s"])
    db = tmp_path / "bench" / "bench.sqlite"
    assert [r["label"] for r in store.query(db)] == ["tunelab round 1", "peer hf-trainer-tuned round 1"]


def test_bench_peer_rejects_unknown_names(bench_args, capsys):
    assert main(["bench", "peers", "axolotl", *bench_args]) == 2
    assert "known peers are" in capsys.readouterr().err


def test_world_size_column_reaches_old_databases_as_one_process(tmp_path):
    import sqlite3

    db = tmp_path / "old.sqlite"
    conn = sqlite3.connect(db)
    conn.execute(
        "CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, timestamp TEXT NOT NULL, kind TEXT NOT NULL)"
    )
    conn.execute("INSERT INTO runs (timestamp, kind) VALUES ('2026-01-01T00:00:00Z', 'tunelab')")
    conn.commit()
    conn.close()
    store.insert(db, {"kind": "tunelab", "world_size": 4})
    store.insert(db, {"kind": "hf-trainer"})
    assert [r["world_size"] for r in store.read(db)] == [1, 4, 1]


@pytest.mark.slow
def test_a_sweep_point_out_of_memory_is_shown_and_the_sweep_goes_on(bench_args, monkeypatch, capsys):
    """A sweep over micro_batch is how a user finds the largest that fits: the one that does not is a row saying
    so (with plan's memory for it), not the end of the sweep. The point runs in a child process, whose error
    comes back pickled."""
    import pickle

    from tunelab.errors import OutOfMemory

    real = loops.measure_point

    def measure_point(cfg, stop_at, warmup):
        if cfg.batch.micro_batch == 4:
            raise pickle.loads(pickle.dumps(OutOfMemory("out of memory on cuda:0 (8.0 GiB) in step 1, ...")))
        return real(cfg, stop_at, warmup)

    monkeypatch.setattr(loops, "measure_point", measure_point)
    monkeypatch.setenv("COLUMNS", "200")  # the table's rows on one line each
    assert main(["bench", "sweep", *bench_args, "--steps", "2", "--warmup", "1", "--axis", "micro_batch=4,2"]) == 0
    printed = capsys.readouterr()
    assert "[1/2] micro_batch=4: out of memory on cuda:0 (8.0 GiB) in step 1, ..." in printed.err
    rows = [line for line in printed.out.splitlines() if "micro_batch=" in line]
    assert len(rows) == 2 and "out of memory" in rows[0] and "GiB" in rows[0] and "out of memory" not in rows[1]

    assert (
        main(["bench", "sweep", *bench_args, "--steps", "2", "--warmup", "1", "--axis", "micro_batch=4", "--json"]) == 2
    )
    assert "tunelab bench: error: out of memory on cuda:0" in capsys.readouterr().err


def test_a_cpu_point_is_probed_again_and_the_cached_probe_stays_for_other_callers(monkeypatch):
    """A shared CPU changes speed between points, so each sweep or suite point on a CPU divides by a probe taken
    right after it (points.point_peak); a plain matmul_peak reads the process's earlier probe."""
    import torch

    from tunelab import probe
    from tunelab.bench import points

    figures = iter(float(x) for x in range(1, 100))
    monkeypatch.setattr(probe, "measure_matmul_peak", lambda dtype, device: (next(figures) * 1e12, 256))
    monkeypatch.setattr(probe, "measure_copy_bandwidth", lambda device: next(figures) * 1e9)
    monkeypatch.setattr(probe, "measure_product_call_s", lambda dtype, device: next(figures) * 1e-6)
    monkeypatch.setattr(probe, "_cache", {})
    monkeypatch.setattr(probe, "_copy_cache", {})
    monkeypatch.setattr(probe, "_call_cache", {})
    summary = {"device": "cpu", "device_memory_bytes": 1 << 30, "precision": "fp32"}
    peaks = {}
    first = points.point_peak(peaks, "cpu", summary, None)
    second = points.point_peak(peaks, "cpu", summary, None)
    assert second.flops > first.flops and second.bandwidth > first.bandwidth > 0  # probed again, not read back
    assert second.call_s > first.call_s > 0  # the product-call probe with them (bench's device_call_s)
    assert "probe" in second.source and second.probes["fp32"] == second.flops
    assert probe.matmul_peak(torch.float32, torch.device("cpu")) == (second.flops, 256)  # the newest stays cached
    assert probe.copy_bandwidth(torch.device("cpu")) == second.bandwidth


def test_the_copy_probe_reads_a_buffer_beyond_the_caches_and_plan_on_a_cpu_uses_it(monkeypatch):
    """plan's memory-bound part on a CPU runs against the copy probe of this machine (or the calibration's);
    given a peak and no bandwidth (the compile decision's floor), no probe runs and the class's figure applies."""
    import torch

    from tunelab import probe
    from tunelab.recipes.predict import local_device

    small = probe.measure_copy_bandwidth(torch.device("cpu"), mib=4, windows=2)
    assert small > 1e8  # bytes read + written per second; any machine copies 4 MiB faster than 0.1 GB/s
    monkeypatch.setattr(probe, "_copy_cache", {"cpu": 12.5e9})
    assert local_device("fp32").gpu.bandwidth_gbs == pytest.approx(12.5)
    assert local_device("fp32", bandwidth_bps=3e9).gpu.bandwidth_gbs == pytest.approx(3.0)
    monkeypatch.setattr(probe, "measure_copy_bandwidth", lambda *a: pytest.fail("the floor must not probe"))
    monkeypatch.setattr(probe, "_copy_cache", {})
    assert local_device("fp32", peak_flops=1e12).gpu.bandwidth_gbs == 0.0


def test_a_calibration_record_of_an_older_schema_is_not_read(tmp_path, monkeypatch):
    """Its step scales were measured against an older step model: plan runs uncalibrated until `bench
    calibrate` writes a new one."""
    from tunelab.plan import calibration

    monkeypatch.setenv("TUNELAB_CACHE", str(tmp_path))
    record = calibration.CalibrationRecord("k", "cpu", peak_flops=1e12, bandwidth_bps=2e10, step_scale={"lora": 1.1})
    calibration.save_calibration(record)
    assert calibration.load_calibration("k") == record
    old = json.loads((calibration.calibration_dir() / "k.json").read_text())
    (calibration.calibration_dir() / "k.json").write_text(json.dumps({**old, "schema": 1}))
    assert calibration.load_calibration("k") is None


def test_bench_records_the_mamf_probe_and_copy_bandwidth_of_every_gpu(monkeypatch, tmp_path):
    """A GPU-only path, run here with the probes mocked: the record keeps the MAMF sweep and the copy probe beside
    the catalog peak it divides by, for a catalog GPU and for an unlisted one alike."""
    import torch

    monkeypatch.setattr(measure, "matmul_peak", lambda dtype, device, fresh=False: (700e12, 8192))
    monkeypatch.setattr(measure, "mamf", lambda dtype, device, fresh=False: (790e12, (2048, 4096, 14336)))
    monkeypatch.setattr(measure, "copy_bandwidth", lambda device, fresh=False: 2.9e12)
    cuda = torch.device("cuda")
    listed = measure.device_peak(cuda, "NVIDIA H100 80GB HBM3", 80 * 2**30, "bf16")
    assert listed.flops == 989e12 and listed.mamf == 790e12 and listed.mamf_shape == (2048, 4096, 14336)
    assert listed.gpu_copy_bps == 2.9e12 and listed.bandwidth == 0.0  # plan keeps the catalog's GPU bandwidth
    assert "MAMF 790.0 TFLOP/s at 2048x4096x14336" in listed.source
    unlisted = measure.device_peak(cuda, "Some Future GPU", 40 * 2**30, "bf16")
    assert unlisted.flops == 700e12 and unlisted.mamf == 790e12
    db = tmp_path / "r.db"
    store.insert(db, {"kind": "run", "mamf_flops": listed.mamf, "mamf_shape": list(listed.mamf_shape)})
    (row,) = store.read(db)
    assert row["mamf_flops"] == 790e12 and row["mamf_shape"] == [2048, 4096, 14336]
