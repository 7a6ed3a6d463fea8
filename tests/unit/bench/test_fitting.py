"""`tunelab bench fit`: the committed rows reproduce the shipped fitted.yaml byte for byte, and a suite results file
named by a row file goes through the fit into fitted.yaml and back to plan predicting the measured rate."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from tunelab.bench import fitting
from tunelab.cli import main
from tunelab.plan import catalog, fit
from tunelab.plan.fit_rows import Row, row_job

PLAN = ["plan", "--model", "llama-3.2-1b", "--method", "lora", "--seq-len", "2048", "--micro-batch", "8"]
PLAN += ["--examples", "1000", "--mean-tokens", "500", "--gpu", "h100-sxm", "--json"]


def _plan(capsys) -> dict:
    assert main(PLAN) == 0
    return json.loads(capsys.readouterr().out.splitlines()[0])


@pytest.fixture
def target(tmp_path, monkeypatch):
    """fitted.yaml as `bench fit --write` writes it, in a test's folder."""
    path = tmp_path / "fitted.yaml"
    monkeypatch.setattr(fit, "FITTED", path)
    # and grpo.yaml beside it, as shipped: a test never writes the catalog in src/
    grpo = tmp_path / "grpo.yaml"
    grpo.write_text((Path(fit.__file__).parent / "catalog" / "grpo.yaml").read_text())
    monkeypatch.setattr(fit, "GRPO_FITTED", grpo)
    return path


def rows_folder(tmp_path, **doc) -> str:
    folder = tmp_path / "rows"
    folder.mkdir()
    (folder / "suites.yaml").write_text(yaml.safe_dump(doc))
    return str(folder)


@pytest.mark.slow  # tokenizes the suites' synthetic rows once (cached in the temp folder after)
def test_the_committed_rows_reproduce_the_shipped_fit_byte_for_byte(target, monkeypatch, capsys):
    text = (Path(fit.__file__).parent / "catalog" / "fitted.yaml").read_text()  # the shipped file
    target.write_text("".join(line for line in text.splitlines(keepends=True) if line.startswith("#")))
    monkeypatch.chdir(REPO)  # the row files name the suite files from the repository's root
    assert main(["bench", "fit", "--write"]) == 0
    assert target.read_text() == text
    shipped = (Path(fit.__file__).parent / "catalog" / "grpo.yaml").read_text()
    assert fit.GRPO_FITTED.read_text() == shipped  # the committed GRPO runs reproduce the shipped GRPO fit too
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith("| device | row | fit | measured s |") and f"wrote: {target}" in out
    assert "left out 8b-lora-65k-offload" in err  # a row of a committed suite file that did not run
    assert main(["bench", "fit", "--write"]) == 0  # the same fit again leaves the file as it is
    assert f"unchanged: {target}" in capsys.readouterr().out


def test_plan_predicts_a_suite_rows_rate_once_fitted_from_its_results_file(tmp_path, target, capsys, monkeypatch):
    """A suite results file named in a row file -> `bench fit --write` -> fitted.yaml -> plan predicts the row's
    step."""
    before = _plan(capsys)
    # the suite's 1B LoRA row ran at 0.8 of plan's rate before the fit; a failed row and a peer without a catalog
    # peak are left out. One row leaves the fit a residual of gap / (1 + sum of the parts' squared shares /
    # PRIOR_WEIGHT) (plan/fit.py): ~0.3 of the gap for this step, split between matmul and memory-bound work.
    rate = 0.8 * before["tokens_per_s"]
    record = {
        "kind": "tunelab",
        "label": "1b-lora",
        "device": "NVIDIA H100 80GB HBM3",
        "model": "random:llama-3.2-1b",
        "method": "lora",
        "grad_ckpt": False,
        "micro_batch": 8,
        "seq_len": 2048,
        "data": {"mean_len": 500},
        "config": {"base_quant": "none", "compile": False, "lora": {"r": 16}},
        "tokens_padded_per_s": rate,
        "device_peak_flops": before["peak_flops"],
        "peak_source": "catalog h100-sxm: NVIDIA H100 datasheet",
    }
    others = [{"kind": "tunelab", "label": "8b-qlora", "error": "OutOfMemoryError"}, {"kind": "trl-sft", "label": "p"}]
    suite = tmp_path / "gpu_nvidia-h100-80gb-hbm3_2026-12-01.json"
    suite.write_text(json.dumps({"date": "2026-12-01", "complete": True, "records": [record, *others]}))
    target.write_text("# header kept\n")
    # a file named twice counts once
    assert main(["bench", "fit", "--rows", rows_folder(tmp_path, suites=[str(suite), str(suite)]), "--write"]) == 0
    err = capsys.readouterr().err
    assert "left out 8b-qlora" in err and "left out p" in err
    written = target.read_text()
    assert written.startswith("# header kept\n")
    row = yaml.safe_load(written)["devices"]["h100-sxm"]
    assert row["rows"] == [f"{suite} row 1b-lora (2026-12-01)"] and "matmul" in row["measured"]

    real = catalog.read
    monkeypatch.setattr(catalog, "read", lambda name: yaml.safe_load(written) if name == "fitted.yaml" else real(name))
    after = _plan(capsys)
    # one row that moves the constants 20% from the assumed ones keeps some of the prior's pull (plan/fit.py)
    assert after["tokens_per_s"] == pytest.approx(rate, rel=0.1)
    assert abs(after["tokens_per_s"] / rate - 1) < 0.5 * abs(before["tokens_per_s"] / rate - 1)


def test_a_cpu_suite_fits_its_class_with_each_rows_probe_and_its_peer_as_the_hf_peft_stack(tmp_path):
    """A CPU's `bench suite` file: each row's device is its CPU class (its precision and the file's class),
    its peak the probe taken after it, a peer takes the probe of the row it follows; a row without a copy
    probe takes the row files' cpu_bandwidth."""
    data = {"rows": 200, "prompt_tokens": "8-40", "response_tokens": "8-60", "dist": "triangular", "seed": 0}

    def record(label, kind, precision, peak, step, **extra):
        return {
            "kind": kind,
            "label": label,
            "model": "random:smollm2-135m",
            "method": "lora",
            "grad_ckpt": False,
            "micro_batch": 8,
            "seq_len": 128,
            "precision": precision,
            "data": {"mean_len": 60.0, "tokens_nonpad": 1000, "tokens_loss": 500},
            "config": {"compile": False, "lora": {"r": 32}},
            "step_time_median_s": step,
            **({"device_peak_flops": peak, "peak_source": "measured now: 1024^3 bf16 matmul probe"} if peak else {}),
            **extra,
        }

    rows = [
        record("lora", "tunelab", "bf16", 1.5e12, 1.0),
        record("peer hf-trainer-tuned", "hf-trainer-tuned", "bf16", None, 2.0, against="lora"),
        record("lora-fp32", "tunelab", "fp32", 0.3e12, 3.0, device_bandwidth_bps=2e10, device_call_s=7e-5),
    ]
    device = {"name": "Some CPU (2 threads)", "type": "cpu", "cpu_class": "avx512-bf16", "isa_cap": None}
    doc = {"date": "2026-12-01", "suite": "cpu-steps", "device": device, "definition": {"data": data}, "records": rows}
    suite = tmp_path / "cpu-steps_some-cpu-avx512-bf16_2026-12-01.json"
    suite.write_text(json.dumps(doc))
    cpu = {"bps": 1.5e10, "device": "cpu-fp32", "source": "a copy probe"}
    result = fitting.run(Path(rows_folder(tmp_path, suites=[str(suite)], cpu_bandwidth=cpu)))
    fitted = result.catalog()
    assert fitted["devices"]["cpu-avx512-bf16"]["rows"] == [f"{suite} row lora (2026-12-01)"]
    assert fitted["devices"]["cpu-fp32"]["rows"] == [f"{suite} row lora-fp32 (2026-12-01)"]
    assert fitted["stacks"]["hf-peft"]["rows"] == [f"{suite} row peer hf-trainer-tuned (2026-12-01)"]
    # every fitted CPU class names the bandwidth it was fitted with: its rows' own copy probes where they ran one,
    # else the row files' figure, carried from the class that measured it
    assert fitted["devices"]["cpu-fp32"]["bandwidth_gbs"] == 20.0
    assert (
        fitted["devices"]["cpu-fp32"]["bandwidth_source"]
        == "median copy probe of its 1 fitted row, each its own machine's"
    )
    assert fitted["devices"]["cpu-avx512-bf16"]["bandwidth_source"] == "a copy probe; carried from class cpu-fp32"
    found = {r["label"]: r for r in result.rows()}
    peer = found["cpu-steps peer hf-trainer-tuned"]
    assert peer["peak"] == 1.5e12 and peer["device"] == "cpu-avx512-bf16" and not peer["packing"]
    assert peer["bandwidth"] == 1.5e10 and found["cpu-steps lora-fp32"]["bandwidth"] == 2e10
    assert found["cpu-steps lora-fp32"]["compute_bytes"] == 4 and found["cpu-steps lora"]["loss_fraction"] == 0.5
    # the product-call probe a row ran with (0 without one: the class's catalog figure)
    assert found["cpu-steps lora-fp32"]["call_s"] == 7e-5 and found["cpu-steps lora"]["call_s"] == 0.0
    # The slot path's squares: more keys per token than the documents' causal pairs.
    assert found["cpu-steps lora"]["keys_per_token"] > 60


def test_a_rows_base_is_the_registrys_not_its_methods_name():
    """QLoRA trains over nf4 whatever the row's base_quant says; LoRA over an nf4 base too."""
    row = Row(
        **{"device": "cpu", "kind": "cpu", "label": "x", "source": "s", "model": "random:smollm2-135m"},
        **{"method": "qlora", "micro_batch": 8, "seq_len": 128, "compiled": False, "grad_ckpt": False},
        **{"measured_s": 1.0, "peak": 1e12, "bandwidth": 2e10, "r": 16, "compute_bytes": 2, "packing": True},
        **{"lengths": "mean:60", "loss_fraction": 0.5},
    )
    assert row_job(row).adapter.quant == "nf4"
    assert row_job(replace(row, method="lora", base_quant="nf4")).adapter.quant == "nf4"
    assert row_job(replace(row, method="lora")).adapter.quant == "none"


def test_a_gpu_suites_liger_peer_is_an_hf_row_with_the_probe_of_the_row_it_follows():
    """A GPU suite's HF peers (tuned, Liger) are hf-peft rows: the Liger peer's `hf` names its kernels, its peak
    is the tunelab row's it ran against, and its lengths are the suite's synthetic rows (a padded peer's padding
    follows their spread)."""
    from tunelab.bench.fit_data import suite_doc_rows

    data = {"rows": 200, "prompt_tokens": "8-40", "response_tokens": "8-60", "dist": "triangular", "seed": 0}
    ran = {
        "kind": "tunelab",
        "label": "8b-lora",
        "model": "random:llama-3.1-8b",
        "method": "lora",
        "grad_ckpt": False,
        "micro_batch": 4,
        "seq_len": 2048,
        "data": {"mean_len": 600.0, "tokens_nonpad": 1000, "tokens_loss": 800},
        "config": {"compile": True, "lora": {"r": 16}},
        "step_time_median_s": 0.5,
        "device_peak_flops": 989e12,
        "peak_source": "catalog h200: datasheet",
    }
    peer = {
        **{k: ran[k] for k in ("model", "method", "grad_ckpt", "seq_len")},
        "kind": "hf-trainer-liger",
        "label": "peer hf-trainer-liger",
        "micro_batch": 16,
        "step_time_median_s": 1.2,
        "against": "8b-lora",
    }
    doc = {"date": "2026-12-01", "suite": "gpu", "device": {"type": "cuda"}, "definition": {"data": data}}
    rows, left_out = suite_doc_rows({**doc, "records": [ran, peer]}, "gpu.json", None)
    assert not left_out
    hf = next(r for r in rows if r.stack == "hf-peft")
    assert hf.hf == "use_liger_kernel=true" and hf.peak == 989e12 and hf.device == "h200"
    assert hf.lengths.startswith("synthetic:") and hf.loss_fraction == 0.8 and not hf.packing


def test_bench_fit_refits_grpos_constants_from_its_runs_and_writes_them_beside_the_rest(tmp_path, monkeypatch, capsys):
    """A GRPO run named in a row file (`grpo`) -> `bench fit --write` -> catalog/grpo.yaml: the fit recovers the
    constants the run's times were made with, on the device the entry names (not the machine that fits), and the
    shipped devices no entry refits stay as they are. No benchmark script writes under src/."""
    from tunelab import config as cfgmod
    from tunelab.plan import grpo_fit
    from tunelab.sources import resolve_arch

    truth = catalog.GrpoConstants(4e-5, 1.25, 1.0, ())
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = cfgmod.load_config(
        None,
        ["model=random:smollm2-135m", "objective=grpo", "data.path=p.jsonl", "grpo.rewards=[{name: exact_answer}]"]
        + ["grpo.num_generations=4", "grpo.max_completion_length=32", "grpo.beta=0.0", "micro_batch=2", "seq_len=96"],
    )
    (run_dir / "config.yaml").write_text(cfgmod.dump_yaml(cfg))
    entry = {"device": "cpu-avx512-bf16", "label": "synthetic", "run": str(run_dir), "model": "random:smollm2-135m"}
    entry |= {"prompts": 64, "prompt_tokens": 20.0, "peak": 4e11, "bandwidth": 2e10}
    shell = grpo_fit.GrpoRun(**{k: entry[k] for k in ("device", "label")}, source=str(run_dir), config=cfg,
        arch=resolve_arch("random:smollm2-135m"), prompts=64, prompt_tokens=20.0, peak=4e11, bandwidth=2e10,
        measured={})  # fmt: skip
    elapsed, records = 0.0, []
    for step, longest in enumerate([20, 24, 28, 24, 22], 1):
        plan = grpo_fit.predicted(shell, truth, longest)
        elapsed += plan.step.batch_s
        records.append({"step": step, "elapsed_s": elapsed, "generation_s": plan.step.generation.total_s})
        records[-1] |= {"completions/max_length": longest, "completions/mean_length": longest - 4.0}
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    folder = tmp_path / "rows"
    folder.mkdir()
    (folder / "3.yaml").write_text((REPO / "benchmarks/plan-accuracy/rows/3_cpu-demos_2026-11-24.yaml").read_text())
    (folder / "grpo.yaml").write_text(yaml.safe_dump({"grpo": [entry]}))
    monkeypatch.setattr(fit, "FITTED", tmp_path / "fitted.yaml")
    monkeypatch.setattr(fit, "GRPO_FITTED", tmp_path / "grpo.yaml")
    shipped = (Path(fit.__file__).parent / "catalog" / "grpo.yaml").read_text()
    fit.GRPO_FITTED.write_text(shipped)
    assert main(["bench", "fit", "--rows", str(folder), "--write"]) == 0
    out = capsys.readouterr().out
    assert f"wrote: {fit.GRPO_FITTED}" in out and "| synthetic | update (one step) |" in out
    written = yaml.safe_load(fit.GRPO_FITTED.read_text())["devices"]
    got = written["cpu-avx512-bf16"]["constants"]
    assert got["decode_op_s"] == pytest.approx(truth.decode_op_s, rel=1e-3)
    assert got["update_scale"] == pytest.approx(truth.update_scale, rel=1e-3)
    assert written["cpu-avx512-bf16"]["rows"] == [str(run_dir)]
    assert written["cpu-fp32"] == yaml.safe_load(shipped)["devices"]["cpu-fp32"]  # no entry refits it: kept
    assert fit.GRPO_FITTED.read_text().startswith("#")  # the header kept
    scripts = (REPO / "benchmarks" / "scripts").glob("*.py")
    assert not [s.name for s in scripts if "grpo.yaml" in s.read_text() and "write_text" in s.read_text()]


def test_moe_rows_are_predicted_with_their_imbalance_and_stay_out_of_the_peer_stacks_bytes(tmp_path):
    """`bench fit` takes an MoE row like any other (its model a folder with a config.json, as plan reads one): each
    row is predicted and its error reported, the routers' measured imbalance pricing a GPU's experts slower (not
    a CPU's, whose experts run one product after another: their sum sets the time), a row
    that adapted the attention only (`targets`) priced without the experts' LoRA; an HF stack's MoE row does not
    set that stack's masked-kernel bytes (its excess holds the experts' dispatch too)."""
    import transformers as tf

    model = tmp_path / "tiny-moe"
    model.mkdir()
    config = tf.Qwen3MoeConfig(
        hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, vocab_size=4096, num_experts=16, num_experts_per_tok=4,
    )  # fmt: skip
    config.to_json_file(model / "config.json")
    base = {"device": "cpu-avx512-bf16", "kind": "cpu", "model": str(model), "method": "lora", "micro_batch": 4}
    base |= {"seq_len": 128, "compiled": False, "grad_ckpt": False, "measured_s": 0.2, "peak": 4e11}
    base |= {"bandwidth": 4e10, "r": 16, "compute_bytes": 2, "packing": False, "lengths": "mean:128"}
    base |= {"loss_fraction": 0.9, "fit": False, "source": "a record"}
    rows = [
        {**base, "label": "uniform"},
        {**base, "label": "skewed", "imbalance": 4.0},
        {**base, "label": "gpu", "device": "h100-sxm", "kind": "cuda", "peak": 9.9e14, "bandwidth": 3.35e12},
        {**base, "label": "gpu skewed", "device": "h100-sxm", "kind": "cuda", "peak": 9.9e14, "bandwidth": 3.35e12}
        | {"imbalance": 4.0},
        {**base, "label": "attention only", "targets": "attn"},
        {**base, "label": "hf", "stack": "hf-peft", "lengths": "span:40-128"},
    ]
    folder = tmp_path / "rows"
    folder.mkdir()
    (folder / "moe.yaml").write_text(yaml.safe_dump({"date": "2026-12-07", "rows": rows}))
    result = fitting.run(folder)
    found = {r["label"]: r for r in result.rows()}
    assert set(found) == {"uniform", "skewed", "gpu", "gpu skewed", "attention only", "hf"}
    for r in found.values():
        assert r["error_in"] == pytest.approx(r["predicted_s_in"] / 0.2 - 1)
    assert found["gpu skewed"]["predicted_s_in"] > found["gpu"]["predicted_s_in"]
    assert found["skewed"]["predicted_s_in"] == pytest.approx(found["uniform"]["predicted_s_in"])
    assert found["attention only"]["predicted_s_in"] < found["uniform"]["predicted_s_in"]
    stacks = result.catalog()["stacks"]["hf-peft"]
    assert stacks["rows"] == [] and stacks["masked_pair_bytes"]["cpu"] == 0.0
