"""plan's GRPO prediction beside measured GRPO runs, by part; with --fit, plan's GRPO constants fitted on some runs
(written to src/tunelab/plan/catalog/grpo.yaml for this machine's class) and checked on the others.

    python benchmarks/scripts/plan_grpo.py --fit RUN [--fit RUN] [--check RUN ...] [--write] [--out FILE.md]
        [--set KEY=VALUE ...]   (overrides applied to every run's config.yaml, e.g. data.path= where it moved)

A run is a `tunelab train` output folder of objective grpo (config.yaml, metrics.jsonl with log_steps 1; the
committed runs keep it as metrics.jsonl.gz). Measured per generation batch (the first left out: warm-up):
sampling = generation_s; its decode steps = the batch's longest completion (the loop runs until every row has stopped); update = a step that reuses the batch (num_iterations > 1),
else the generating step minus sampling minus plan's scoring passes; scoring = the generating step minus sampling
minus the update. The fit: decode_op_s from (sampling - plan's prefill FLOP time - steps x plan's bytes/FLOP time
per decode step) / ((steps + 1) x a forward's ops); where the fitted runs sample at several batch sizes, also the
fraction of the peak a decode step's products reach (decode_flop_efficiency, the best of a grid); update_scale and
scoring_scale as measured over plan's. plan is
asked with the run's measured decode steps as its completion length and the run's share of completions the update
ran (`tunelab plan --from-run`: the per-step model is what is fitted; how long completions run and how many carry
a gradient are the run's), and with its upper bounds (the config's cap, every completion), as `tunelab plan`
prints without a trial run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

import yaml

from tunelab import config as cfgmod
from tunelab.plan import catalog
from tunelab.plan.estimate import constants_key
from tunelab.plan.grpo import GrpoWorkload
from tunelab.recipes import predict

GRPO_YAML = Path(__file__).resolve().parents[2] / "src" / "tunelab" / "plan" / "catalog" / "grpo.yaml"


def measured(run: Path) -> dict:
    """Per-part medians over the run's generation batches after the first."""
    path = run / "metrics.jsonl"
    text = path.read_text() if path.exists() else gzip.decompress(path.with_suffix(".jsonl.gz").read_bytes()).decode()
    recs = [json.loads(line) for line in text.splitlines()]
    prev, batches, updates = 0.0, [], []
    for r in recs:
        step_s = r["elapsed_s"] - prev
        prev = r["elapsed_s"]
        if r["generation_s"] > 0:
            batches.append({"step_s": step_s, "sampling_s": r["generation_s"], "steps": r["completions/max_length"]})
        elif batches:
            updates.append(step_s)
    later = batches[1:] or batches
    # The update's share of completions (runs before it left zero-advantage ones out have no such field: all).
    ran = [r["update_completions"] / r["completions_per_batch"] for r in recs if "update_completions" in r]
    return {
        "share": statistics.fmean(ran) if ran else 1.0,
        "batches": len(batches),
        "sampling_s": statistics.median(b["sampling_s"] for b in later),
        "decode_steps": statistics.median(b["steps"] for b in later),
        "generating_step_s": statistics.median(b["step_s"] for b in later),
        "update_only_s": statistics.median(updates[1:] or updates) if updates else None,
        "mean_length": statistics.fmean(r["completions/mean_length"] for r in recs),
        "samples": later,
    }


def predicted(cfg: cfgmod.TrainConfig, fit: catalog.GrpoConstants | None, steps: float | None, share: float = 1.0):
    """plan's GeneratingPlan for `cfg` on this machine with `fit` as its GRPO constants (None: plan's own), the
    decode running `steps` (None: to the cap) and the update over `share` of the completions."""
    real = catalog.grpo_constants
    if fit is not None:
        catalog.grpo_constants = lambda device: fit
    try:
        request = predict.PlanRequest(gpu="local", grpo=GrpoWorkload(steps, share))
        return predict.plan_generating(cfg, request)[0]
    finally:
        catalog.grpo_constants = real


def fit_constants(runs: list[tuple[Path, cfgmod.TrainConfig, dict]]) -> catalog.GrpoConstants:
    """decode_op_s (and, where the runs sample at more than one batch size, decode_flop_efficiency: the grid value
    whose op cost fits every batch's sampling time best, in squared relative error), update_scale, scoring_scale."""
    sizes = {cfg.batch.micro_batch * cfg.batch.grad_accum * cfg.objective.grpo.num_generations for _, cfg, _ in runs}
    grid = [e / 100 for e in range(5, 101)] if len(sizes) > 1 else [1.0]
    best = min((sampling_fit(runs, e) for e in grid), key=lambda fit: fit[2])
    update, scoring = [], []
    for _, cfg, m in runs:
        zero = predicted(cfg, catalog.GrpoConstants(0.0, 1.0, 1.0, ()), m["decode_steps"], m["share"])
        up = m["update_only_s"] if m["update_only_s"] is not None else None
        if up is not None:
            update.append(up / zero.step.update_s)
            if zero.step.scoring_passes:
                rest = m["generating_step_s"] - m["sampling_s"] - up
                scoring.append(rest / zero.step.scoring_s)  # over plan's at update_scale 1: divided by it below
        elif cfg.objective.grpo.num_iterations == 1 and not zero.step.scoring_passes:
            update.append((m["generating_step_s"] - m["sampling_s"]) / zero.step.update_s)
    med = lambda xs: statistics.median(xs) if xs else 1.0  # noqa: E731
    # plan's scoring pass is a third of the (scaled) update: its own factor is what remains after update_scale.
    scoring_scale = med(scoring) / med(update)
    rows = tuple(str(r) for r, _, _ in runs)
    return catalog.GrpoConstants(best[0], med(update), scoring_scale, rows, best[1])


def sampling_fit(runs, efficiency: float) -> tuple[float, float, float]:
    """(decode_op_s, efficiency, squared relative error over every batch) at this decode FLOP efficiency: the op
    cost is the median over batches of what their sampling time leaves after plan's prefill and decode FLOPs."""
    per_batch, shapes = [], []
    for _, cfg, m in runs:
        zero = predicted(cfg, catalog.GrpoConstants(0.0, 1.0, 1.0, (), efficiency), m["decode_steps"])
        one = predicted(cfg, catalog.GrpoConstants(1.0, 1.0, 1.0, (), efficiency), m["decode_steps"])
        launches = (one.step.generation.total_s - zero.step.generation.total_s) / (m["decode_steps"] + 1)
        for b in m["samples"]:
            per_batch.append((b["sampling_s"] - zero.step.generation.total_s) / ((b["steps"] + 1) * launches))
            shapes.append((b, zero.step.generation.total_s, launches))
    op_s = max(statistics.median(per_batch), 0.0)
    error = sum(((base + (b["steps"] + 1) * n * op_s) / b["sampling_s"] - 1) ** 2 for b, base, n in shapes)
    return op_s, efficiency, error


def table_rows(run: Path, cfg, m: dict, fit) -> list[str]:
    at_steps = predicted(cfg, fit, m["decode_steps"], m["share"])
    at_cap = predicted(cfg, fit, None)
    s = at_steps.step
    iters = cfg.objective.grpo.num_iterations
    measured_batch = m["generating_step_s"] + (iters - 1) * (m["update_only_s"] or 0.0)
    update = m["update_only_s"]
    if update is None and not s.scoring_passes:  # num_iterations 1, no reference: the step is sampling + update
        update = m["generating_step_s"] - m["sampling_s"]
    rows = [
        ("sampling (prefill + decode)", s.generation.total_s, m["sampling_s"]),
        ("update (one step)", s.update_s, update),
        ("scoring passes", s.scoring_s, None if update is None else m["generating_step_s"] - m["sampling_s"] - update),
        (
            f"decode per token step at batch {s.generation.rows}",
            s.generation.decode_s / max(m["decode_steps"], 1),
            None,
        ),
        ("generation batch", s.batch_s, measured_batch),
        (
            f"generation batch, plan's upper bound (the cap {cfg.objective.grpo.max_completion_length}, every completion)",
            at_cap.step.batch_s,
            measured_batch,
        ),
    ]
    out = []
    for name, p, got in rows:
        err = "" if not got else f"{(p - got) / got:+.0%}"
        out.append(f"| {run.name} | {name} | {p:.2f} | {'-' if got is None else f'{got:.2f}'} | {err} |")
    return out


def load(run: Path, sets: list[str]) -> cfgmod.TrainConfig:
    return cfgmod.load_config(run / "config.yaml", sets)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fit", type=Path, action="append", default=[])
    p.add_argument("--check", type=Path, action="append", default=[])
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE for every run's config")
    p.add_argument("--write", action="store_true", help="store the fit for this machine's class in grpo.yaml")
    p.add_argument("--out", type=Path, help="append the table to this markdown file")
    args = p.parse_args(argv)
    fits = [(r, load(r, args.set), measured(r)) for r in args.fit]
    fit = fit_constants(fits) if fits else None
    key = constants_key(predict.local_device(fits[0][1].compute.precision if fits else "auto"))
    lines = [f"device class `{key}`; fitted: {fit}", "", "| run | part | plan (s) | measured (s) | plan vs measured |"]
    lines.append("|---|---|---|---|---|")
    for r, cfg, m in fits:
        lines += table_rows(r, cfg, m, fit)
    for r in args.check:
        cfg, m = load(r, args.set), measured(r)
        lines += [
            row.replace(f"| {r.name} |", f"| {r.name} (not in the fit) |", 1) for row in table_rows(r, cfg, m, fit)
        ]
        lines.append(
            f"<!-- {r.name}: mean completion length {m['mean_length']:.1f}, decode steps {m['decode_steps']}, "
            f"update share {m['share']:.3f} -->"
        )
    text = "\n".join(lines)
    print(text)
    if args.out:
        with args.out.open("a") as f:
            f.write(text + "\n")
    if args.write and fit is not None:
        data = yaml.safe_load(GRPO_YAML.read_text()) or {}
        devices = data.get("devices") or {}
        devices[key] = {
            "constants": {
                "decode_op_s": float(f"{fit.decode_op_s:.4g}"),
                "update_scale": float(f"{fit.update_scale:.4g}"),
                "scoring_scale": float(f"{fit.scoring_scale:.4g}"),
                "decode_flop_efficiency": float(f"{fit.decode_flop_efficiency:.4g}"),
            },
            "rows": list(fit.rows),
        }
        header = "".join(line + "\n" for line in GRPO_YAML.read_text().splitlines() if line.startswith("#"))
        GRPO_YAML.write_text(header + yaml.safe_dump({"devices": devices}, sort_keys=True, width=120))
    return 0


if __name__ == "__main__":
    sys.exit(main())
