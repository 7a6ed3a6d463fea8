"""How close is plan's step-time model to every measured row, with the row's device in the fit and left out?

    .venv/bin/python benchmarks/scripts/plan_accuracy.py [--out benchmarks/plan-accuracy/plan-accuracy_<date>]
        [--rows benchmarks/plan-accuracy/rows] [--calibrated FILE.json]

The report of `tunelab bench fit` (bench/fitting.py: the same rows, the same fit): the measured rows of the row
files (benchmarks/plan-accuracy/rows/: copies of the H200 and H100 records under ../shared/gpu-baseline/, the
CPU classes' dated demo and bench records, and the committed `tunelab bench suite` files they name), each
predicted with its device in the fit and left out, the targets counted, in `<out>.md` and `<out>.json`.
`tunelab bench fit --write` stores the fit in src/tunelab/plan/catalog/fitted.yaml.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "plan-accuracy" / f"plan-accuracy_{time.strftime('%Y-%m-%d')}"
    )
    p.add_argument("--rows", type=Path, default=REPO / "benchmarks" / "plan-accuracy" / "rows", help="row files")
    p.add_argument("--calibrated", type=Path, help="benchmarks/scripts/calibration.py results (.json) to list beside")
    args = p.parse_args(argv)
    out, rows, calibrated = (x.resolve() if x else None for x in (args.out, args.rows, args.calibrated))
    sys.path.insert(0, str(REPO / "src"))
    from tunelab.bench import fitting

    os.chdir(REPO)  # the row files name the suite files from the repository's root
    result = fitting.run(rows)
    for line in result.left_out:
        print(line, file=sys.stderr)
    doc = {
        "date": time.strftime("%Y-%m-%d"),
        "command": "benchmarks/scripts/plan_accuracy.py",
        "cpu_bandwidth_source": result.cpu_bandwidth.source if result.cpu_bandwidth else None,
        "devices": result.devices(),
        "hf_peft_scale": {k: v for k, (_d, v) in result.ratios.get("hf-peft", {}).items()},
        "rows": result.rows(),
    }
    if calibrated:
        doc["calibrated"] = json.loads(calibrated.read_text())
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".md").write_text(render_md(doc))
    print(render_md(doc))
    return 0


def render_md(doc: dict) -> str:
    from tunelab.bench.fitting import constants_table, rows_table

    lines = [
        f"# plan's step-time model against every measured row ({doc['date']})",
        "",
        f"Written by `{doc['command']}`. Each row: the measured seconds per optimizer step, plan's",
        "predicted step (plan/steptime.py) with the row's device in the fit (`in`) and left out of it (`out`: the",
        "constants pooled over the other measured devices of its kind, or the kind's assumed constants where no other",
        "device of that kind is measured), and the errors. `fit: no` rows are predicted but never fitted.",
        "",
        *rows_table(doc["rows"]),
    ]
    lines += targets(doc["rows"]) + repeats(doc["rows"]) + NOTES
    lines += ["", "Constants per device (fraction of peak / of bandwidth, seconds per launch):", ""]
    lines += constants_table(doc["devices"])
    if "calibrated" in doc:
        c = doc["calibrated"]
        lines += [
            "",
            f"After `tunelab bench calibrate` on {c['device']}: predicted {c['predicted_train_s']:.1f} s, "
            f"measured {c['measured_train_s']:.1f} s ({c['error']:+.1%}) for {c['steps']} steps.",
        ]
    return "\n".join(lines) + "\n"


def repeats(rows: list[dict]) -> list[str]:
    """Rows measured more than once (the same device, recipe and stack in several files): the spread of their
    measured steps, against which no model of the step can be closer than half of it."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["kind"] == "cpu" and "cpu-steps" in r["label"]:
            groups.setdefault((r["device"], r["label"], r["stack"]), []).append(r)
    found = {k: v for k, v in groups.items() if len(v) > 1}
    if not found:
        return []
    out = [
        "",
        "## The same rows measured again",
        "",
        "| device | row | measured s, each run | slowest / fastest | matmul probe TFLOP/s, each run |",
        "|---|---|---|---|---|",
    ]
    for (device, label, _stack), rs in found.items():
        steps = [r["measured_s"] for r in rs]
        measured = ", ".join(f"{x:.2f}" for x in steps)
        probes = ", ".join(f"{r['peak'] / 1e12:.2f}" for r in rs)
        out.append(f"| {device} | {label} | {measured} | {max(steps) / min(steps):.2f} | {probes} |")
    return out


def targets(rows: list[dict]) -> list[str]:
    """The issue's targets, counted: in the fit within 15%, left out within 25%, the hf-peft stack within 25%."""

    def share(sel, key, limit):
        hit = [r for r in sel if abs(r[key]) <= limit]
        return f"{len(hit)} of {len(sel)}"

    fitted = [r for r in rows if r["fit"] and r["stack"] == "tunelab"]
    peers = [r for r in rows if r["stack"] == "hf-peft"]
    older = [r for r in rows if not r["fit"] and r["stack"] == "tunelab"]
    out = ["", "## Targets", ""]
    out.append(f"- fitted rows within 15% with their device in the fit: {share(fitted, 'error_in', 0.15)}")
    out.append(f"- fitted rows within 25% with their device left out: {share(fitted, 'error_out', 0.25)}")
    for dev in dict.fromkeys(r["device"] for r in fitted):
        sel = [r for r in fitted if r["device"] == dev]
        out.append(f"  - {dev}: in {share(sel, 'error_in', 0.15)}, left out {share(sel, 'error_out', 0.25)}")
    out.append(
        f"- hf-peft stack (the peer's rows) within 25%: in {share(peers, 'error_in', 0.25)}, "
        f"left out {share(peers, 'error_out', 0.25)}"
    )
    out.append(f"- rows of older code, predicted and not fitted, within 25%: {share(older, 'error_in', 0.25)}")
    pairs = {r["label"]: r for r in fitted}
    for eager, compiled in (("1b-lora", "1b-lora-compiled"), ("8b-lora", "8b-lora-compiled")):
        if eager in pairs and compiled in pairs:
            e, c = pairs[eager], pairs[compiled]
            out.append(
                f"- compile, {eager}: eager / compiled step measured {e['measured_s'] / c['measured_s']:.2f}, "
                f"predicted {e['predicted_s_in'] / c['predicted_s_in']:.2f} in the fit, "
                f"{e['predicted_s_out'] / c['predicted_s_out']:.2f} left out"
            )
    return out


NOTES = [
    "",
    "## What it shows, and where it falls short",
    "",
    "- The H200 is the only GPU measured with the current code. Left out, it has no other GPU of current code to",
    "  borrow from, so its `out` column is the cuda kind's assumed constants (plan/fit.py `ASSUMED`), not another",
    "  device's fit: that the H200's rows land close to them says the assumptions are sound, not that the",
    "  constants carry across GPUs. An H100 suite run of the same rows on the current code is the missing proof.",
    "- The H100 rows are tunelab at 747991f, whose steps were host-bound and erratic (recompiles, slow eager",
    "  launches; ../shared/gpu-baseline/README.md); they are predicted with the H200's constants and shown, not",
    "  fitted.",
    "- Full fine-tuning on the H200 is under-predicted (its row above); the tied embedding's dense gradient is",
    "  still uncounted, and a profile of a full step on a GPU would place the rest.",
    "- The CPU classes: besides the `make demo` runs, `tunelab bench suite cpu-steps` measured the quickstart's",
    "  model in six step kinds and the tuned HF peer on one 2-core Xeon, with AMX (three runs) and capped to",
    "  AVX-512 BF16 and to AVX2 (one run each; the caps change the units the matmuls run on, not the memory).",
    "  Each row divides by the matmul probe taken right after it, and the third AMX run's rows by their own copy",
    "  probe too (the others by CPU_BANDWIDTH, the median of those probes). On a CPU the slot path computes each",
    "  micro-batch's slots whole, and its scores' element-wise passes are memory-bound work (docs/formulas.md).",
    '- The same AMX rows measured three times within an hour differ by up to 2x ("The same rows measured',
    '  again"), and neither probe follows it: the fp32 matmul probe stayed at 0.22-0.32 TFLOP/s in all three,',
    "  and the third run's copy probe within 17-22 GB/s while its lora-ckpt row took 1.42x the first run's. No",
    "  fit can be nearer than half that spread to all three, which is most of the AMX rows' misses in and out",
    "  of the fit. The capped classes, measured once each, miss by more than 15% in one row each (AVX-512 BF16",
    "  `full`, whose probe read half of its neighbours', and its compiled row). The targets on a CPU need a",
    "  machine whose speed holds still.",
    "- Rows older than the current code (2026-11-22 bench records) and the EPYC demo runs (another machine,",
    "  whose bandwidth was never probed) are predicted with the same constants.",
]


if __name__ == "__main__":
    sys.exit(main())
