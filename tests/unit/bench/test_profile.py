"""`tunelab bench profile`: a profiled run after the measured one, and its per-step summary."""

import gzip
import json
from types import SimpleNamespace

import pytest
from conftest import write_jsonl

from tunelab.bench import store
from tunelab.bench.profile import summarize
from tunelab.cli import main


def _event(key: str, count: int = 1, cpu_us: float = 0.0, device_us: float = 0.0, on_device: bool = False):
    from torch.autograd import DeviceType

    return SimpleNamespace(
        key=key,
        count=count,
        self_cpu_time_total=cpu_us,
        self_device_time_total=device_us,
        device_type=DeviceType.CUDA if on_device else DeviceType.CPU,
        is_user_annotation=False,
    )


def test_a_step_whose_device_idles_between_kernels_is_host_bound():
    stamps = {2: 10.0, 4: 11.0}  # two steps of 0.5 s
    events = [
        # The launching operator carries its kernels' time too: counted once, on the kernel.
        _event("aten::mm", 40, cpu_us=300_000, device_us=700_000),
        _event("cudaLaunchKernel", 600, cpu_us=500_000),
        _event("sm90_xmma_gemm_bf16", 40, device_us=700_000, on_device=True),
        _event("cudaStreamSynchronize", 2, cpu_us=200_000),  # waiting is not host work
    ]
    found = summarize(events, 2, stamps, 2)
    assert found["step_wall_s"] == pytest.approx(0.5)
    assert found["host_op_s_per_step"] == pytest.approx(0.4) and found["host_wait_s_per_step"] == pytest.approx(0.1)
    assert found["device_busy_s_per_step"] == pytest.approx(0.35) and found["device_busy_share"] == pytest.approx(0.7)
    assert found["kernel_launches_per_step"] == 300 and found["aten_ops_per_step"] == 20
    assert found["host_bound"] is True
    # Profiler ranges on the device's timeline are annotations, not work.
    annotation = _event("ProfilerStep#3", 1, device_us=900_000, on_device=True)
    annotation.is_user_annotation = True
    assert summarize([*events, annotation], 2, stamps, 2)["device_busy_s_per_step"] == pytest.approx(0.35)
    events[2] = _event("sm90_xmma_gemm_bf16", 40, device_us=960_000, on_device=True)
    assert summarize(events, 2, stamps, 2)["host_bound"] is False  # busy 96% of the step
    # On a CPU nothing runs on a device: never called host-bound, the host is the device.
    assert summarize(events[:2], 2, stamps, 2)["host_bound"] is False


@pytest.mark.slow
def test_bench_profile_writes_where_a_steps_time_goes(tiny_model_dir, addition_rows, tmp_path, capsys):
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows * 4)
    where = tmp_path / "profile"
    args = [f"model={tiny_model_dir}", f"data.path={data}", "data.template=compact", "seq_len=64", "micro_batch=2"]
    args += ["precision=fp32", f"output_dir={tmp_path / 'bench'}", "--steps", "2", "--warmup", "1"]
    assert main(["bench", "profile", str(where), *args, "--json"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 and json.loads(out)["steps"] == 2  # the measured point alone on stdout
    assert f"profile: {where} (2 steps of " in err and "operators per step)" in err

    found = json.loads((where / "profile.json").read_text())
    assert found["steps"] == 2 and found["device"] == "cpu" and found["host_bound"] is False
    assert 0 < found["host_op_s_per_step"] and 0 < found["step_wall_s"] < 60
    assert found["device_busy_s_per_step"] == 0 and found["kernel_launches_per_step"] == 0
    assert found["aten_ops_per_step"] > 100  # forward, backward and the optimizer of a 2-layer model
    assert sorted(p.name for p in where.iterdir()) == ["ops.txt", "profile.json", "trace.json.gz"]
    ops = (where / "ops.txt").read_text()
    assert "aten::mm" in ops and "Self CPU" in ops
    with gzip.open(where / "trace.json.gz", "rt") as f:
        assert any(e.get("name") == "aten::mm" for e in json.load(f)["traceEvents"])
    # The profiled run is not a measurement: the database holds the measured point only.
    assert len(store.query(tmp_path / "bench" / "bench.sqlite")) == 1


def test_profile_writes_into_a_folder(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["bench", "profile", str(tmp_path / "file")]) == 2
    assert "DIR" in capsys.readouterr().err
