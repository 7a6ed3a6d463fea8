"""Throughput, time and cost.

time_train = optimizer steps x step seconds (plan/steptime.py, by part) / (GPUs x scaling); a calibrated device
keeps time_train = tokens_padded x hardware_flops_per_token / (peak x calibrated efficiency x GPUs x scaling)
(docs/formulas.md). Every fed position costs compute, padding included; recomputation counts because the
hardware does it.
Fixed overheads are separate lines: model load, torch.compile, checkpoint writes, evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..methods import Method
from . import catalog


@dataclass(frozen=True)
class Efficiency:
    value: float
    label: str


@dataclass(frozen=True)
class Throughput:
    tokens_per_s: float  # padded tokens fed per second, all GPUs together
    train_s: float


def step_throughput(
    tokens_padded: int, tokens_per_step: float, step_s: float, gpus: int = 1, scaling: float = 1.0
) -> Throughput:
    """The rate of `tokens_per_step` fed per GPU every `step_s` (plan/steptime.py), all GPUs together."""
    rate = tokens_per_step / step_s * gpus * (scaling if gpus > 1 else 1.0)
    return Throughput(rate, tokens_padded / rate)


@dataclass(frozen=True)
class Overheads:
    model_load_s: float
    compile_s: float
    checkpoint_s: float
    eval_s: float

    @property
    def total(self) -> float:
        return self.model_load_s + self.compile_s + self.checkpoint_s + self.eval_s


def checkpoint_bytes(trainable_params: int, total_params: int, method: Method) -> tuple[int, int]:
    """(periodic, final) checkpoint sizes: a resumable checkpoint holds the fp32 trainable weights and
    AdamW's two fp32 states (12 B/param); the final save holds the adapter (fp32) or the full model (fp32)."""
    periodic = trainable_params * 12
    final = (total_params if method.trains_base else trainable_params) * 4
    return periodic, final


def overheads(
    weights_on_disk: int,
    periodic_checkpoints: int,
    periodic_bytes: int,
    final_bytes: int,
    compiled: bool,
    device_type: str,
    eval_s: float = 0.0,
) -> Overheads:
    """Fixed costs at the catalog's disk speeds and compile time for `device_type` (catalog/gpus.yaml)."""
    read_bps, write_bps = catalog.disk_bps()
    return Overheads(
        model_load_s=weights_on_disk / read_bps,
        compile_s=catalog.compile_seconds(device_type) if compiled else 0.0,
        checkpoint_s=(periodic_checkpoints * periodic_bytes + final_bytes) / write_bps,
        eval_s=eval_s,
    )


def steps_within(limit_s: float, steps: int, train_s: float, fixed_s: float) -> int:
    """How many of a run's `steps` (`train_s` in all, `fixed_s` of it once: compilation) end within `limit_s`
    (`max_minutes`; 0: all): the loop stops after the last step that its mean step time says still fits."""
    if limit_s <= 0 or train_s <= limit_s:
        return steps
    return min(steps, max(1, math.floor((limit_s - fixed_s) / ((train_s - fixed_s) / steps))))


def evaluation_seconds(tokens_padded: int, forward_flops_per_token: float, peak_flops: float, eff: float) -> float:
    """Evaluation time: fed held-out tokens (all evaluations together) at the forward-only rate, with the
    method's training efficiency. One device's rate: every rank evaluates the whole held-out set."""
    return tokens_padded * forward_flops_per_token / (peak_flops * eff)


def cost(hours: float, price_per_hour: float, instances: int) -> float:
    """The price of `instances` whole instances (each billed at `price_per_hour`) for `hours`."""
    return hours * price_per_hour * instances
