"""A CPU class is priced from rows measured on like hardware: the vendor splits AVX-512 BF16 and fp32
(catalog.local_class), each vendor's class holds only its own machine's rows, and a vendor or a CPU without rows of
its own falls back to the class over the vendors measured (benchmarks/plan-accuracy/
cpu-calibration_epyc-avx512bf16-2c_2026-12-08.md: one constant for a capped Xeon and an EPYC put plan 26-33% fast
on the EPYC and printed a useful MFU of 113%)."""

import re

import pytest

from tunelab import device as devmod
from tunelab.bench.fit_data import suite_doc_rows
from tunelab.plan import catalog, fit

# The words a row's source names its machine by: the EPYC's records say epyc, the Xeon's xeon.
MACHINE = {"amd": "epyc", "intel": "xeon"}


@pytest.mark.parametrize("base", ["cpu-avx512-bf16", "cpu-fp32"])
@pytest.mark.parametrize("vendor", ["amd", "intel"])
def test_a_vendors_class_is_fitted_on_that_vendors_rows_alone(base, vendor):
    key = catalog.local_class("cpu", "fp32" if base == "cpu-fp32" else "bf16", "avx512-bf16", vendor)
    assert key == f"{base}-{vendor}"
    rows = catalog.step_constants(key, "cpu").rows
    assert rows, key
    other = MACHINE["intel" if vendor == "amd" else "amd"]
    assert all(MACHINE[vendor] in r.lower() and other not in r.lower() for r in rows), rows


def test_a_cpu_of_unknown_vendor_gets_its_class_pooled_over_the_measured_vendors():
    data = catalog.read("fitted.yaml")
    pooled = data["classes"]["cpu-avx512-bf16"]
    assert set(pooled["devices"]) == {"cpu-avx512-bf16-amd", "cpu-avx512-bf16-intel"}
    key = catalog.local_class("cpu", "bf16", "avx512-bf16", "")  # /proc/cpuinfo names neither vendor
    got = catalog.step_constants(key, "cpu")
    assert key == "cpu-avx512-bf16" and got.measured == ()
    assert got.matmul == pytest.approx(pooled["constants"]["matmul"]) and set(got.carried_from) == set(
        pooled["devices"]
    )
    # the product-call cost and GRPO's fit are keyed by the class over all vendors: a vendor's class finds them
    assert catalog.product_call_s("cpu-fp32-intel", "cpu") == catalog.product_call_s("cpu-fp32", "cpu")
    assert catalog.grpo_constants("cpu-fp32-amd") == catalog.grpo_constants("cpu-fp32")


def test_a_suite_file_files_its_rows_under_the_cpus_vendor():
    """A `bench suite` file's CPU rows: the vendor the file records, else the one its device's name says."""
    record = {
        "kind": "tunelab", "label": "lora", "model": "random:smollm2-135m", "method": "lora", "grad_ckpt": False,
        "micro_batch": 4, "seq_len": 128, "precision": "bf16", "config": {}, "step_time_median_s": 1.0,
        "device_peak_flops": 4e11, "device_bandwidth_bps": 3e10, "data": {"tokens_nonpad": 10, "tokens_loss": 5},
    }  # fmt: skip
    data = {"rows": 10, "prompt_tokens": "8-40", "response_tokens": "8-60", "dist": "triangular", "seed": 0}
    devices = []
    for dev in (
        {"name": "AMD EPYC 9R14 (2 threads)"},
        {"name": "Intel(R) Xeon(R) Processor (2 threads)"},
        {"name": "Some CPU (2 threads)", "cpu_vendor": "amd"},
        {"name": "Some CPU (2 threads)"},
    ):
        doc = {"date": "2026-12-08", "suite": "s", "definition": {"data": data}, "records": [record]}
        doc["device"] = {"type": "cpu", "cpu_class": "avx512-bf16", **dev}
        devices.append(suite_doc_rows(doc, "s.json", None)[0][0].device)
    assert devices == ["cpu-avx512-bf16-amd", "cpu-avx512-bf16-intel", "cpu-avx512-bf16-amd", "cpu-avx512-bf16"]
    assert devmod.vendor_of_name("AMD Ryzen 9 7950X") == "amd" and devmod.vendor_of_name("Ampere Altra") == ""


def test_a_vendor_left_out_of_the_fit_is_priced_as_plan_prices_it_from_the_other_vendor():
    """`bench fit`'s left-out figure for a vendor's class is what plan would use without its rows: its class's other
    vendor, not the pool of every CPU (AMX and fp32 among them)."""
    obs = [
        fit.Observation("cpu-avx512-bf16-intel", "cpu", "a", "x", (1.0, 0.1, 0.2, 10.0), 2.0),
        fit.Observation("cpu-avx512-bf16-amd", "cpu", "b", "y", (1.0, 0.1, 0.2, 10.0), 1.2),
        fit.Observation("cpu", "cpu", "c", "z", (1.0, 0.1, 0.2, 10.0), 0.5),
    ]
    out = fit.fit_device(obs, "cpu-avx512-bf16-amd", leave_out=True)
    assert out.carried_from == ("cpu-avx512-bf16-intel",)
    assert out.constants == fit.solve(obs[:1], fit.ASSUMED["cpu"])  # the Intel row's alone
    assert out.constants != fit.pooled(obs, "cpu", without="cpu-avx512-bf16-amd")[0]
    assert fit.fit_device(obs, "cpu", leave_out=True).carried_from == ("cpu-avx512-bf16-intel", "cpu-avx512-bf16-amd")


def test_plan_of_the_embedded_model_on_a_probed_epyc_stays_under_the_probes_peak(monkeypatch, capsys):
    """`plan --gpu local` on a 2-core EPYC with AVX-512 BF16 (its class and probes mocked at what this machine
    measures: 414 GFLOP/s bf16, 30 GB/s copy) prices the embedded model below the matmul probe's peak: it printed
    a useful MFU of 113% on the constants fitted mostly on a capped Xeon."""
    from tunelab.cli import main

    monkeypatch.setattr(devmod, "cpu_class", lambda: "avx512-bf16")
    monkeypatch.setattr(devmod, "cpu_vendor", lambda: "amd")
    monkeypatch.setattr("tunelab.plan.calibration.load_calibration", lambda key: None)
    monkeypatch.setattr("tunelab.probe.matmul_peak", lambda dtype, dev: (4.14e11, 2048))
    monkeypatch.setattr("tunelab.probe.copy_bandwidth", lambda dev: 3.0e10)
    monkeypatch.setattr("tunelab.probe.product_call_s", lambda dtype, dev: 3.5e-5)
    args = ["plan", "--model", "embedded", "--gpu", "local", "--examples", "1000", "--mean-tokens", "64"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "class cpu-avx512-bf16-amd" in out
    useful = [int(x) for x in re.findall(r"useful MFU (\d+)%", out)]
    assert useful and all(0 < u < 100 for u in useful), out
