"""plan's GRPO constants (catalog/grpo.yaml) fitted to measured GRPO runs, per device: what `tunelab bench fit`
refits with the step-time constants (plan/fit.py), and the table of plan beside each run by part.

A run is a `tunelab train` output folder of objective grpo (its config.yaml, and metrics.jsonl with log_steps 1),
named in a row file with the device it ran on: its class, its probed peak and bandwidth, and its prompts' count and
mean tokens (bench/fit_data.py reads them), so the fit does not depend on the machine that refits it. Measured per
generation batch (the first left out: warm-up): sampling = generation_s; its decode steps = the batch's longest
completion (the loop runs until every row has stopped); update = a step that reuses the batch (num_iterations > 1),
else the generating step minus sampling minus plan's scoring passes; scoring = the generating step minus sampling
minus the update. The fit: decode_op_s from (sampling - plan's prefill FLOP time - steps x plan's bytes/FLOP time
per decode step) / ((steps + 1) x a forward's ops); where a device's runs sample at several batch sizes, also the
fraction of the peak a decode step's products reach (decode_flop_efficiency, the best of a grid); update_scale and
scoring_scale as measured over plan's. plan is asked with the run's measured decode steps and update share (the
per-step model is what is fitted; how long completions run and how many carry a gradient are the run's). Torch-free.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .. import config as cfgmod
from . import catalog
from .arch import Arch
from .estimate import Device
from .grpo import GeneratingPlan, GrpoWorkload, Prompts, plan_grpo
from .job import Job


@dataclass(frozen=True)
class GrpoRun:
    """One measured GRPO run, as a row file names it, with what its metrics.jsonl measured (`measured`)."""

    device: str  # the class its constants are filed under (catalog/grpo.yaml's key)
    label: str
    source: str  # the run's folder
    config: cfgmod.TrainConfig
    arch: Arch
    prompts: int
    prompt_tokens: float
    peak: float  # FLOP/s of the device's matmul probe when the run ran
    bandwidth: float  # bytes/s of its copy probe
    measured: dict

    def device_row(self) -> Device:
        gpu = catalog.Gpu(
            "local", self.label, 0, self.bandwidth / 1e9, self.peak, False, self.device, source=self.source
        )
        kind = "cpu" if self.device.startswith("cpu") else "cuda"
        return Device(gpu, catalog.runtime_overhead(kind))


def measured(records: list[dict]) -> dict:
    """Per-part medians over a run's metrics.jsonl records (log_steps 1), its generation batches after the first."""
    prev, batches, updates = 0.0, [], []
    for r in records:
        step_s = r["elapsed_s"] - prev
        prev = r["elapsed_s"]
        if r.get("generation_s", 0) > 0:
            batches.append({"step_s": step_s, "sampling_s": r["generation_s"], "steps": r["completions/max_length"]})
        elif batches:
            updates.append(step_s)
    later = batches[1:] or batches
    # The update's share of completions (runs before it left zero-advantage ones out have no such field: all).
    ran = [r["update_completions"] / r["completions_per_batch"] for r in records if "update_completions" in r]
    return {
        "share": statistics.fmean(ran) if ran else 1.0,
        "batches": len(batches),
        "sampling_s": statistics.median(b["sampling_s"] for b in later),
        "decode_steps": statistics.median(b["steps"] for b in later),
        "generating_step_s": statistics.median(b["step_s"] for b in later),
        "update_only_s": statistics.median(updates[1:] or updates) if updates else None,
        "mean_length": statistics.fmean(r["completions/mean_length"] for r in records),
        "samples": later,
    }


def predicted(
    run: GrpoRun, fit: catalog.GrpoConstants | None, steps: float | None, share: float = 1.0
) -> GeneratingPlan:
    """plan's GeneratingPlan for `run` on its own device with `fit` as its GRPO constants (None: none fitted), the
    decode running `steps` (None: plan's own) and the update over `share` of the completions."""
    prompts = Prompts(run.prompts, run.prompt_tokens, run.source)
    return plan_grpo(Job.of(run.config), run.arch, prompts, GrpoWorkload(steps, share), run.device_row(), constants=fit)


def fit_constants(runs: list[GrpoRun]) -> catalog.GrpoConstants:
    """decode_op_s (and, where the runs sample at more than one batch size, decode_flop_efficiency: the grid value
    whose op cost fits every batch's sampling time best, in squared relative error), update_scale, scoring_scale."""
    sizes = {
        r.config.batch.micro_batch * r.config.batch.grad_accum * r.config.objective.grpo.num_generations for r in runs
    }
    grid = [e / 100 for e in range(5, 101)] if len(sizes) > 1 else [1.0]
    best = min((sampling_fit(runs, e) for e in grid), key=lambda fit: fit[2])
    update, scoring = [], []
    for run in runs:
        m = run.measured
        zero = predicted(run, catalog.GrpoConstants(0.0, 1.0, 1.0, ()), m["decode_steps"], m["share"])
        up = m["update_only_s"]
        if up is not None:
            update.append(up / zero.step.update_s)
            if zero.step.scoring_passes:
                rest = m["generating_step_s"] - m["sampling_s"] - up
                scoring.append(rest / zero.step.scoring_s)  # over plan's at update_scale 1: divided by it below
        elif run.config.objective.grpo.num_iterations == 1 and not zero.step.scoring_passes:
            update.append((m["generating_step_s"] - m["sampling_s"]) / zero.step.update_s)
    med = lambda xs: statistics.median(xs) if xs else 1.0  # noqa: E731
    # plan's scoring pass is a third of the (scaled) update: its own factor is what remains after update_scale.
    scoring_scale = med(scoring) / med(update)
    return catalog.GrpoConstants(best[0], med(update), scoring_scale, tuple(r.source for r in runs), best[1])


def sampling_fit(runs: list[GrpoRun], efficiency: float) -> tuple[float, float, float]:
    """(decode_op_s, efficiency, squared relative error over every batch) at this decode FLOP efficiency: the op
    cost is the median over batches of what their sampling time leaves after plan's prefill and decode FLOPs."""
    per_batch, shapes = [], []
    for run in runs:
        m = run.measured
        zero = predicted(run, catalog.GrpoConstants(0.0, 1.0, 1.0, (), efficiency), m["decode_steps"])
        one = predicted(run, catalog.GrpoConstants(1.0, 1.0, 1.0, (), efficiency), m["decode_steps"])
        launches = (one.step.generation.total_s - zero.step.generation.total_s) / (m["decode_steps"] + 1)
        for b in m["samples"]:
            per_batch.append((b["sampling_s"] - zero.step.generation.total_s) / ((b["steps"] + 1) * launches))
            shapes.append((b, zero.step.generation.total_s, launches))
    op_s = max(statistics.median(per_batch), 0.0)
    error = sum(((base + (b["steps"] + 1) * n * op_s) / b["sampling_s"] - 1) ** 2 for b, base, n in shapes)
    return op_s, efficiency, error


def fit_devices(runs: list[GrpoRun]) -> dict[str, catalog.GrpoConstants]:
    """Each device's GRPO constants, fitted to its own runs."""
    devices: dict[str, list[GrpoRun]] = {}
    for run in runs:
        devices.setdefault(run.device, []).append(run)
    return {device: fit_constants(own) for device, own in sorted(devices.items())}


def catalog_document(fits: dict[str, catalog.GrpoConstants], kept: dict | None = None) -> dict:
    """catalog/grpo.yaml's `devices` from the fits; `kept`: the shipped devices no row refits, unchanged."""
    devices = dict(kept or {})
    for device, fit in fits.items():
        devices[device] = {
            "constants": {
                "decode_op_s": float(f"{fit.decode_op_s:.4g}"),
                "update_scale": float(f"{fit.update_scale:.4g}"),
                "scoring_scale": float(f"{fit.scoring_scale:.4g}"),
                "decode_flop_efficiency": float(f"{fit.decode_flop_efficiency:.4g}"),
            },
            "rows": list(fit.rows),
        }
    return {"devices": dict(sorted(devices.items()))}


def table_rows(run: GrpoRun, fit: catalog.GrpoConstants | None) -> list[list[str]]:
    """plan beside the run by part ([run, part, plan s, measured s, plan vs measured]), at the run's decode steps
    and update share, and at plan's upper bound (the cap, every completion)."""
    m = run.measured
    at_steps = predicted(run, fit, m["decode_steps"], m["share"])
    at_cap = predicted(run, fit, run.config.objective.grpo.max_completion_length)
    s = at_steps.step
    iters = run.config.objective.grpo.num_iterations
    measured_batch = m["generating_step_s"] + (iters - 1) * (m["update_only_s"] or 0.0)
    update = m["update_only_s"]
    if update is None and not s.scoring_passes:  # num_iterations 1, no reference: the step is sampling + update
        update = m["generating_step_s"] - m["sampling_s"]
    rows = [
        ("sampling (prefill + decode)", s.generation.total_s, m["sampling_s"]),
        ("update (one step)", s.update_s, update),
        ("scoring passes", s.scoring_s, None if update is None else m["generating_step_s"] - m["sampling_s"] - update),
        ("generation batch", s.batch_s, measured_batch),
        (
            f"generation batch at the cap ({run.config.objective.grpo.max_completion_length}), every completion",
            at_cap.step.batch_s,
            measured_batch,
        ),
    ]
    return [
        [run.label, name, f"{p:.2f}", "-" if got is None else f"{got:.2f}", f"{(p - got) / got:+.0%}" if got else ""]
        for name, p, got in rows
    ]
