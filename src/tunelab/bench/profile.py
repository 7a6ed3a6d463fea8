"""`tunelab bench profile DIR`: where a training step's time goes, from torch.profiler over a few steady steps.

A profiled run is its own process, after the measured one: the profiler slows every operator it records, so
its steps are never the ones a rate is read from. It runs the point's warm-up (compiling, first allocations)
unrecorded, then records `steps` optimizer steps, their log sync included, and writes to DIR:
- `ops.txt`: operators and kernels by self time (device time on a GPU, host time on a CPU), as torch prints them;
- `trace.json.gz`: the timeline, for chrome://tracing or Perfetto;
- `profile.json`: per step, the wall time, the host's own operator time, the device's busy time and share of
  the step, and the number of kernel launches. A step whose device is busy for less than 90% of it is
  host-bound: the device waits for the next launch (docs/metrics.md#host-bound-steps).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .. import config as cfgmod
from ..io import write_atomic

PROFILED_STEPS = 3
# CUDA runtime and driver calls that start one kernel each.
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")
# A step whose kernels cover less of its wall time than this leaves the device idle between launches: launching,
# not computing, sets the pace (the rest of a step is launch gaps, since syncs are only at the log).
BUSY_SHARE = 0.9
# Calls whose own time is the host waiting for the device, not working.
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cuStreamSynchronize")


def profile_length(warmup: int, steps: int) -> int:
    """Optimizer steps a profiled run takes: at least one warm-up step, since the first step allocates and
    compiles, then the recorded ones."""
    return max(warmup, 1) + steps


def profile_point(cfg: cfgmod.TrainConfig, warmup: int, steps: int, out: Path) -> dict:
    """Run `cfg` for `warmup` + `steps` optimizer steps in a fresh process, the last `steps` under the profiler;
    write the three files to `out` and return profile.json's content. The run's own output (metrics, adapter)
    is scratch, removed afterwards."""
    import shutil
    import tempfile
    from dataclasses import replace

    from .points import in_fresh_process

    scratch = Path(tempfile.mkdtemp(prefix="tunelab-profile-"))
    try:
        cfg = replace(cfg, run=replace(cfg.run, output_dir=str(scratch / "run")))
        return in_fresh_process(_profile_in_child, cfg, profile_length(warmup, 0), steps, str(out))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _profile_in_child(cfg: cfgmod.TrainConfig, warmup: int, steps: int, out: str) -> dict:
    from torch.profiler import ProfilerActivity, profile, schedule

    from ..device import pick_device
    from ..libraries import quiet_libraries
    from ..recipes import entry
    from ..train.loop import Measurement

    quiet_libraries()
    cuda = pick_device(cfg.compute.device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    # The step before the recorded ones is the profiler's own warm-up (its start-up cost stays out).
    plan = schedule(wait=warmup - 1, warmup=1, active=steps, repeat=1)
    stamps: dict[int, float] = {}
    found: dict = {}

    def on_trace_ready(prof) -> None:
        found.update(write_profile(prof, Path(out), cuda, steps, stamps, warmup))

    with profile(activities=activities, schedule=plan, on_trace_ready=on_trace_ready) as prof:

        def on_step(step: int) -> None:
            stamps[step] = time.perf_counter()
            prof.step()

        measure = Measurement(stop_at=warmup + steps, warmup_window=warmup, on_step=on_step)
        entry.train(cfg, show_progress=False, measure=measure)
    return found


def write_profile(prof, out: Path, cuda: bool, steps: int, stamps: dict[int, float], warmup: int) -> dict:
    """ops.txt, trace.json.gz and profile.json from a finished profiling cycle of `steps` optimizer steps."""
    out.mkdir(parents=True, exist_ok=True)
    events = prof.key_averages()
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    write_atomic(out / "ops.txt", [events.table(sort_by=sort, row_limit=40) + "\n"])
    prof.export_chrome_trace(str(out / "trace.json.gz"))
    summary = summarize(events, steps, stamps, warmup)
    summary["device"] = "cuda" if cuda else "cpu"
    write_atomic(out / "profile.json", [json.dumps(summary, indent=2) + "\n"])
    return summary


def summarize(events, steps: int, stamps: dict[int, float], warmup: int) -> dict:
    """Per-step figures from the profiler's key averages (times in its microseconds, reported in seconds).

    Device time is what torch's own table totals: the own time of the events that ran on the device (kernels,
    copies), not the operators that launched them, which carry the same time again, nor annotated ranges.
    Host time is the own CPU time of every host event (the profiler step's own time is the Python between
    operators) less the calls that wait for the device; on a GPU it also counts the autograd thread's operators
    while the main thread waits for them, so the verdict reads the device's side: a step whose kernels keep the
    device busy for less than BUSY_SHARE of its wall time leaves the device waiting for launches. On a CPU the
    operators run on the host, so device time is 0 and the host time is the computation itself."""
    from torch.autograd import DeviceType

    on_device = [e for e in events if e.device_type != DeviceType.CPU and not getattr(e, "is_user_annotation", False)]
    on_host = [e for e in events if e.device_type == DeviceType.CPU]
    wait_us = sum(e.self_cpu_time_total for e in on_host if e.key in WAITS)
    host_us = sum(e.self_cpu_time_total for e in on_host) - wait_us
    device_us = sum(e.self_device_time_total for e in on_device)
    launches = sum(e.count for e in on_host if e.key in LAUNCHES)
    ops = sum(e.count for e in on_host if e.key.startswith("aten::"))
    wall = (stamps[warmup + steps] - stamps[warmup]) / steps
    busy = device_us / 1e6 / steps
    return {
        "steps": steps,
        "step_wall_s": wall,
        "host_op_s_per_step": host_us / 1e6 / steps,
        "host_wait_s_per_step": wait_us / 1e6 / steps,
        "device_busy_s_per_step": busy,
        "device_busy_share": busy / wall if wall > 0 else 0.0,
        "kernel_launches_per_step": launches / steps,
        "aten_ops_per_step": ops / steps,
        "host_bound": 0 < busy < BUSY_SHARE * wall,
    }
