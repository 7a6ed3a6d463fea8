"""The table of benchmarks/scripts/optimizers.sh's and optimizers_long.sh's runs: each run's loss curve, final loss,
held-out exact match (`<run>.eval.json`, optimizers_long.sh) and measured peak beside plan's peak for the same
config on this machine (`tunelab plan --config <run>/config.yaml --gpu local`).

    PYTHONPATH=src python benchmarks/scripts/optimizers_table.py /tmp/optim-bench > out.json
    # the results file's table and a loss plot from that JSON, no run or plan again:
    PYTHONPATH=src python benchmarks/scripts/optimizers_table.py --markdown out.json --plot curves.png
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

import yaml

from tunelab.cli import main
from tunelab.markdown import num, table

# The config keys that tell the runs apart (the rest is the script's common settings).
SETTINGS = ("optimizer", "optimizer_in_backward", "weights", "bf16_update")
# Steps whose loss the markdown table shows (a plot shows every step).
SHOWN = (1, 2, 4, 6, 8, 10, 12, 16, 24, 32, 48, 64)


def plan_peak(config: Path) -> int:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--config", str(config), "--gpu", "local", "--json"]) == 0
    return json.loads(out.getvalue().splitlines()[0])["peak_memory_bytes"]


def settings(config: Path) -> str:
    """The run's optimizer settings as `key=value`, bf16_update only where the weights are bf16."""
    c = yaml.safe_load(config.read_text())
    keys = [k for k in SETTINGS if k != "bf16_update" or c.get("weights") == "bf16"]
    return " ".join(f"{k}={str(c[k]).lower() if isinstance(c[k], bool) else c[k]}" for k in keys)


def collect(root: Path) -> list[dict]:
    rows = []
    for run in sorted(p for p in root.iterdir() if (p / "summary.json").is_file() and p.name != "probe"):
        summary = json.loads((run / "summary.json").read_text())
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        logged = [r for r in records if "loss" in r]  # eval lines (EVAL_STEPS) hold eval_loss alone
        held_out = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
        curve = [r["loss"] for r in logged]
        predicted = plan_peak(run / "config.yaml")
        measured = summary["peak_memory_bytes"]
        scores = root / f"{run.name}.eval.json"
        score = json.loads(scores.read_text()) if scores.is_file() else {}
        rows.append(
            {
                "run": run.name,
                "settings": settings(run / "config.yaml"),
                "loss_curve": curve,
                "loss_last": curve[-1],
                # the peak so far at each logged step: on CPU the RSS peak, which allocator retention can grow
                "peak_curve_bytes": [r["peak_memory_bytes"] for r in logged],
                "eval_loss_curve": held_out,
                "exact_match": score.get("accuracy"),
                "exact_match_n": score.get("n"),
                "peak_measured_bytes": measured,
                "peak_plan_bytes": predicted,
                "plan_error": predicted / measured - 1,
                "tokens_nonpad_per_s": summary["tokens_nonpad_per_s"],
            }
        )
    return rows


def markdown(rows: list[dict], reference: str) -> list[str]:
    """Three tables: loss at fixed steps; final loss (against the `reference` run's), exact match and peaks
    against plan; the peak so far at the same steps beside plan's."""
    steps = [s for s in SHOWN if s <= max(len(r["loss_curve"]) for r in rows)]
    curves = table(
        ["run", "settings", *(f"step {s}" for s in steps)],
        [
            [
                r["run"],
                f"`{r.get('settings', '')}`",
                *(num(r["loss_curve"][s - 1], 3) for s in steps if s <= len(r["loss_curve"])),
            ]
            for r in rows
        ],
    )
    ref = next((r for r in rows if r["run"] == reference), None)
    results = table(
        ["run", "final loss", f"vs {reference}", "held-out exact match", "peak measured GiB", "plan GiB", "plan error"],
        [
            [
                r["run"],
                num(r["loss_last"], 3),
                "n/a" if ref is None else f"{r['loss_last'] - ref['loss_last']:+.3f}",
                "n/a" if r.get("exact_match") is None else f"{r['exact_match']:.0%} of {r['exact_match_n']}",
                num(r["peak_measured_bytes"] / 2**30, 2),
                num(r["peak_plan_bytes"] / 2**30, 2),
                f"{r['plan_error']:+.0%}",
            ]
            for r in rows
        ],
    )
    growth = table(
        ["run: peak so far, GiB", *(f"step {s}" for s in steps), "plan"],
        [
            [
                r["run"],
                *(num(r["peak_curve_bytes"][s - 1] / 2**30, 2) for s in steps if s <= len(r["peak_curve_bytes"])),
                num(r["peak_plan_bytes"] / 2**30, 2),
            ]
            for r in rows
            if "peak_curve_bytes" in r
        ],
    )
    evals = sorted({step for r in rows for step, _ in r.get("eval_loss_curve", [])})
    held_out = table(
        ["run: held-out loss", *(f"step {s}" for s in evals), f"vs {reference} at the end"],
        [
            [
                r["run"],
                *(num(dict(r["eval_loss_curve"]).get(s, float("nan")), 4) for s in evals),
                "n/a"
                if ref is None or not ref.get("eval_loss_curve")
                else f"{r['eval_loss_curve'][-1][1] - ref['eval_loss_curve'][-1][1]:+.4f}",
            ]
            for r in rows
            if r.get("eval_loss_curve")
        ],
    )
    return [*curves, "", *results, "", *growth, *(["", *held_out] if evals else [])]


def main_() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path, help="the runs' folder ($OUT), or with --markdown/--plot this script's JSON")
    p.add_argument("--markdown", action="store_true", help="print the results file's tables from the JSON")
    p.add_argument("--reference", default="adamw", help="the run the final losses are compared with")
    p.add_argument("--plot", type=Path, help="write the loss curves as a PNG (tunelab's report plot) from the JSON")
    args = p.parse_args()
    if not (args.markdown or args.plot):
        json.dump(collect(args.source), sys.stdout, indent=1)
        return
    rows = json.loads(args.source.read_text())
    if args.markdown:
        print("\n".join(markdown(rows, args.reference)))
    if args.plot:
        from tunelab.report import plots

        plots.loss_curves({r["run"]: list(enumerate(r["loss_curve"], 1)) for r in rows}, args.plot)


if __name__ == "__main__":
    main_()
