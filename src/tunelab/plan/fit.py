"""The step-time constants (steptime.Constants) fitted to measured rows, per device, and carried over to
devices without rows (docs/formulas.md#fitting-the-constants).

A step's time is linear in x = (1/matmul, 1/attention, 1/bandwidth, launch_s) (steptime.Work.coefficients), so
a device's constants are a least squares on the rows' relative errors, with a weak pull (PRIOR_WEIGHT) towards
the constants pooled over the other measured devices of its kind: a constant the device's rows say little
about (a part that is a small share of every measured step) stays what the other devices measured, and is
reported as carried over. Leaving a device out is the same fit with its rows removed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from . import catalog
from .steptime import Constants

# The shipped fits, which `tunelab bench fit --write` replaces: the step-time constants, and GRPO's
# (plan/grpo_fit.py).
FITTED = Path(__file__).parent / "catalog" / "fitted.yaml"
GRPO_FITTED = Path(__file__).parent / "catalog" / "grpo.yaml"

# Relative weight of the pull towards the pooled constants, against one row's squared relative error. A
# constant counts as measured on a device when its rows' summed squared time shares reach this weight.
PRIOR_WEIGHT = 0.05
# Starting constants of a kind with no measured device at all: assumptions, printed as such. cuda: a large bf16
# GEMM reaches ~0.8 of the dense datasheet peak (docs/formulas.md), attention about half of that, element-wise
# kernels ~0.7 of the bandwidth, ~5 µs of host time per eager launch. cpu: relative to the bf16/fp32 matmul probe
# and to the copy probe (probe.copy_bandwidth): element-wise work at about the copy's rate, which the part of a
# micro-batch that stays in cache beats and fp32 upcasts fall short of.
ASSUMED = {
    "cuda": Constants(matmul=0.75, attention=0.35, bandwidth=0.7, launch_s=5e-6),
    "cpu": Constants(matmul=0.8, attention=0.3, bandwidth=1.0, launch_s=2e-5),
}


def ridge(kind: str, peak_flops: float, bandwidth_bps: float) -> float:
    """FLOPs per byte above which a GEMM is compute-bound: the ratio of the achieved rates at the kind's
    assumed constants (fixed, so that which GEMMs are memory-bound does not move with the fit). On an H200
    that is 220 (the datasheet ratio is 206)."""
    c = ASSUMED[kind]
    return peak_flops * c.matmul / (bandwidth_bps * c.bandwidth)


@dataclass(frozen=True)
class Observation:
    device: str  # catalog/fitted.yaml key: a catalog GPU id or a local CPU class
    kind: str  # cuda | cpu: devices of one kind lend each other their constants
    label: str
    source: str  # the results file and row
    coefficients: tuple[float, float, float, float]  # steptime.Work.coefficients
    measured_s: float  # measured seconds per optimizer step
    fit: bool = True  # False: predicted and shown, never fitted (e.g. rows of older code)
    # Seconds of the step priced by a measured constant rather than a fitted one (an MoE model's per-expert product
    # calls on a CPU at the product-call probe's cost): added to every prediction, left out of what the fit solves.
    fixed_s: float = 0.0


@dataclass(frozen=True)
class Fitted:
    constants: Constants
    measured: tuple[str, ...]  # Constants fields the device's own rows determine
    carried_from: tuple[str, ...]  # devices the other constants come from (empty: assumed)
    rows: tuple[str, ...]  # sources of the device's fitted rows


def to_x(c: Constants) -> np.ndarray:
    return np.array([1 / c.matmul, 1 / c.attention, 1 / c.bandwidth, c.launch_s])


def from_x(x: np.ndarray) -> Constants:
    return Constants(matmul=1 / x[0], attention=1 / x[1], bandwidth=1 / x[2], launch_s=float(x[3]))


def predict_s(c: Constants, coefficients: tuple[float, ...], fixed_s: float = 0.0) -> float:
    return float(np.dot(coefficients, to_x(c))) + fixed_s


def solve(obs: list[Observation], prior: Constants, weight: float = PRIOR_WEIGHT) -> Constants:
    """Least squares of sum (predicted/measured - 1)^2 + weight x sum (x_j/prior_j - 1)^2 over x; a constant
    whose solution is not positive is held at the prior and the rest solved again."""
    p = to_x(prior)
    free = [True] * 4
    for _ in range(4):
        rows = [np.array(o.coefficients) / o.measured_s for o in obs]
        targets = [1.0 - o.fixed_s / o.measured_s for o in obs]
        for j in range(4):
            e = np.zeros(4)
            e[j] = math.sqrt(weight) / p[j]
            rows.append(e)
            targets.append(math.sqrt(weight))
        a, b = np.array(rows), np.array(targets)
        fixed = np.array([not f for f in free])
        b = b - a[:, fixed] @ p[fixed]
        x = p.copy()
        x[~fixed] = np.linalg.lstsq(a[:, ~fixed], b, rcond=None)[0]
        bad = [j for j in range(4) if free[j] and x[j] <= 0]
        if not bad:
            return from_x(x)
        for j in bad:
            free[j] = False
    return from_x(p)


def cpu_class_of(device: str) -> str:
    """The CPU class over all vendors a vendor's class belongs to (catalog.class_chain); "" for any other device."""
    chain = catalog.class_chain(device)
    return chain[-1] if len(chain) > 1 else ""


def pooled(
    obs: list[Observation], kind: str, without: str | None = None, within: str = ""
) -> tuple[Constants, tuple[str, ...]]:
    """Constants of `kind` fitted over all its measured devices' rows but `without`'s (with `within`, only the
    vendors' devices of that CPU class), and those devices; the kind's assumed constants when there are none."""
    rows = [o for o in obs if o.kind == kind and o.fit and o.device != without]
    if within:
        rows = [o for o in rows if cpu_class_of(o.device) == within]
    devices = tuple(dict.fromkeys(o.device for o in rows))
    if not rows:
        return ASSUMED[kind], ()
    return solve(rows, ASSUMED[kind]), devices


def measured_names(obs: list[Observation], c: Constants, weight: float = PRIOR_WEIGHT) -> tuple[str, ...]:
    """The constants these rows determine: those whose part's squared share of the step, summed over the
    rows, reaches the prior's weight."""
    x = to_x(c)
    shares = np.zeros(4)
    for o in obs:
        shares += (np.array(o.coefficients) * x / o.measured_s) ** 2
    return tuple(name for name, s in zip(Constants.names(), shares) if s >= weight)


def fit_device(obs: list[Observation], device: str, leave_out: bool = False) -> Fitted:
    """`device`'s constants: its rows on the pooled constants of the other devices of its kind; with
    `leave_out`, those pooled constants alone (the device's rows unseen)."""
    own = [o for o in obs if o.device == device and o.fit]
    kind = next(o.kind for o in obs if o.device == device)
    prior, others = pooled(obs, kind, without=device)
    if leave_out or not own:
        # As plan prices a device without rows (catalog.step_constants): a vendor's CPU class, its class's other
        # vendors' constants where one is measured; else the kind's, a GPU's at its own ceilings.
        family = cpu_class_of(device)
        shared, vendors = pooled(obs, kind, without=device, within=family) if family else (prior, ())
        if vendors:
            return Fitted(shared, (), vendors, ())
        scaled = catalog.ceiling_scale(device, others, {d: {"constants": asdict(prior)} for d in others})
        return Fitted(replace(prior, **scaled), (), others, ())
    c = solve(own, prior)
    return Fitted(c, measured_names(own, c), others, tuple(o.source for o in own))


def pair_bytes(per_row: list[float]) -> float:
    """A stack's bytes per masked head-pair: the mean of its rows' (arithmetic: a row's excess can be negative)."""
    return float(sum(per_row) / len(per_row))


@dataclass(frozen=True)
class DeviceFit:
    included: Fitted  # the device's rows in the fit
    left_out: Fitted  # the constants its rows would get from the other devices alone


def fit_devices(obs: list[Observation]) -> dict[str, DeviceFit]:
    """Every device of `obs`, in their order, fitted with its rows and with them left out."""
    devices = dict.fromkeys(o.device for o in obs)
    return {d: DeviceFit(fit_device(obs, d), fit_device(obs, d, leave_out=True)) for d in devices}


def catalog_text(document: dict, previous: str) -> str:
    """catalog/fitted.yaml's text for `document`: the comment lines of `previous` (the file's header), then the
    document, keys sorted."""
    import yaml

    header = "".join(line for line in previous.splitlines(keepends=True) if line.startswith("#"))
    return header + yaml.safe_dump(document, sort_keys=True, width=120)


def write_catalog(document: dict, target: Path) -> bool:
    """Store `document` in `target` (atomically), keeping its header; False when it already holds it."""
    from ..io import write_atomic

    previous = target.read_text() if target.exists() else ""
    text = catalog_text(document, previous)
    if text == previous:
        return False
    write_atomic(target, [text])
    return True
