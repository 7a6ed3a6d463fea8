"""Fit a device's calibration record from measured bench points (`tunelab bench calibrate`).

What `plan --gpu local` needs to reproduce a measurement:
- efficiency per method: plan predicts a record without step_scale at tokens_padded/s = peak x efficiency /
  hardware_flops_per_token (plan/estimate.py), so the fitted efficiency is the measured steady-state rate
  times plan's hardware FLOPs per token over the peak stored beside it (`measure.achieved_efficiency`). Peak
  and efficiency are saved together: their product is the achieved FLOP/s, so the probe's own noise cancels
  out of the prediction.
- step_scale per method: the measured optimizer step over the step model's (plan/steptime.py) for the same run,
  at the same peak. plan multiplies the model's step of any other shape by it, so what the model knows of
  micro-batch, seq_len and the data carries over; `efficiency` (flat, from FLOPs alone) stays for older plans.
- runtime_overhead_bytes: the measured peak minus the memory model's prediction without overhead, from the
  first point (the config's own method). On CPU that is the process's fixed cost beyond the model's terms
  (allocator and oneDNN arenas, load-time copies); on CUDA the context and allocator caching.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan.calibration import CalibrationRecord, scale_key
from ..plan.flops import FlopsPerToken
from .measure import Peak, achieved_efficiency


@dataclass(frozen=True)
class Point:
    """One measured calibration run and plan's figures for the same settings."""

    method_key: str  # methods.Method.key: lora | dora | qlora | full | lora-int8 | dora-nf4 | ...
    tokens_padded_per_s: float
    flops: FlopsPerToken
    peak_memory_bytes: int
    memory_without_overhead: int  # plan's predicted peak with runtime_overhead = 0
    measured_step_s: float = 0.0  # the steady-state optimizer step
    model_step_s: float = 0.0  # the step model's step for the same run at the record's peak, uncalibrated
    compiled: bool = False  # whether the measured run compiled its blocks


def fit(
    key: str,
    name: str,
    peak: Peak,
    points: list[Point],
    previous: CalibrationRecord | None = None,
    source: str = "tunelab bench calibrate",
) -> CalibrationRecord:
    """A new record; efficiencies of methods not re-measured are kept from `previous`, rescaled to the new
    peak so their achieved FLOP/s stays what was measured."""
    if not points:
        raise ValueError("calibration needs at least one measured point")
    efficiency: dict[str, float] = {}
    step_scale: dict[str, float] = {}
    if previous is not None and previous.peak_flops:
        scale = previous.peak_flops / peak.flops
        efficiency = {k: v * scale for k, v in previous.efficiency.items()}
        step_scale = dict(previous.step_scale)
    for p in points:
        efficiency[p.method_key] = achieved_efficiency(p.tokens_padded_per_s, p.flops.hardware, peak.flops)
        if p.measured_step_s > 0 and p.model_step_s > 0:
            step_scale[scale_key(p.method_key, p.compiled)] = p.measured_step_s / p.model_step_s
    first = points[0]
    return CalibrationRecord(
        device_key=key,
        device_name=name,
        peak_flops=peak.flops,
        peak_dtype=peak.dtype,
        bandwidth_bps=peak.bandwidth or None,
        efficiency=efficiency,
        runtime_overhead_bytes=first.peak_memory_bytes - first.memory_without_overhead,
        step_scale=step_scale,
        source=f"{source}: {', '.join(p.method_key for p in points)}; peak {peak.source}",
    )
