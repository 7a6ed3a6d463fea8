"""plan's CPU step error per machine and class, as benchmarks/plan-accuracy/cpu-calibration_*.md reports it.

    PYTHONPATH=src python benchmarks/scripts/cpu_calibration.py ROWS OUT.json [OLD_FITTED.yaml]

`tunelab bench fit` over the row files of ROWS, then per group of rows (device class, the machine and kind of
run its source names, stack): the median and largest |error| with the row's device in the fit, each fitted CPU
row left out of its own device's fit (rows that are not fitted are held out already), and the device left out
(its constants from the other devices, as plan prices a device without rows). With OLD_FITTED (a fitted.yaml of
an earlier commit), also the 2026-12-08 rows under its constants for their class over all vendors. OUT.json:
every row, the groups and the constants.
"""

from __future__ import annotations

import json
import statistics as st
import sys
from dataclasses import replace
from pathlib import Path

from tunelab.bench import fitting
from tunelab.plan import fit


def group(r: dict) -> str:
    s, label = r["source"], r["label"]
    if "moe-cpu" in label:
        kind = "epyc-dense-twin" if "1x1x" in label else "epyc-moe-cpu-path"
    elif "moe-" in label:
        kind = "epyc-moe-older"
    elif "xeon-processor-avx512" in s:
        kind = "xeon-capped-avx512bf16"
    elif "xeon-processor-fp32" in s:
        kind = "xeon-capped-fp32"
    elif "xeon-processor-amx" in s or "xeon-amx" in s:
        kind = "xeon-amx"
    elif "epyc" in s and "quickstart" in s:
        kind = "epyc-demo"
    elif "epyc" in s:
        kind = "epyc-cpu-steps"
    else:
        kind = "gpu"
    return f"{r['device']} {kind} {r['stack']}"


def main(folder: str, out: str, old: str | None = None) -> None:
    res = fitting.run(Path(folder))
    obs = [x.observation for x in res.observed]
    held = {}
    for i, o in enumerate(obs):
        if o.kind == "cpu" and o.fit and o.label:
            rest = obs[:i] + [replace(o, fit=False)] + obs[i + 1 :]
            c = fit.fit_device(rest, o.device).constants
            held[i] = fit.predict_s(c, o.coefficients, o.fixed_s) / o.measured_s - 1
    rows = []
    keys = ("device", "label", "source", "fit", "stack", "measured_s", "predicted_s_in", "error_in", "error_out")
    for i, r in enumerate(res.rows()):
        row = {k: r[k] for k in keys} | {"peak": r["peak"], "bandwidth": r["bandwidth"]}
        row["error_heldout"] = (
            held.get(i, r["error_in"]) if i in held or not r["fit"] or r["stack"] != "tunelab" else None
        )
        rows.append(row)
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(group(r), []).append(r)
    summary = {}
    for name, members in groups.items():
        summary[name] = {"n": len(members)}
        for key in ("error_in", "error_heldout", "error_out"):
            errors = [abs(r[key]) for r in members if r[key] is not None]
            summary[name][key] = {"median": st.median(errors), "max": max(errors)} if errors else None
        cells = [
            f"{label} {v['median']:.1%} (max {v['max']:.1%})" if v else f"{label} -"
            for label, v in zip(
                ("in", "held out", "device out"), (summary[name][k] for k in ("error_in", "error_heldout", "error_out"))
            )
        ]
        print(f"{name:58} n={len(members):2} " + " | ".join(cells))
    doc = {"rows": rows, "groups": summary, "devices": res.devices()}
    if old:
        import yaml

        shipped = yaml.safe_load(Path(old).read_text())["devices"]
        doc["old_constants_on_new_rows"] = {}
        for x in res.observed:
            if "2026-12-08" in x.row.source and x.row.stack == "tunelab":
                c = fit.Constants(**shipped[x.row.device.rsplit("-", 1)[0]]["constants"])
                o = x.observation
                e = fit.predict_s(c, o.coefficients, o.fixed_s) / o.measured_s - 1
                doc["old_constants_on_new_rows"][f"{x.row.device} {x.row.label}"] = e
                print(f"old constants: {x.row.device} {x.row.label}: {e:+.1%}")
    Path(out).write_text(json.dumps(doc, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:4])
