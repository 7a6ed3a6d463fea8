"""plan's measured efficiencies (src/tunelab/plan/catalog/measured.yaml) from GPU suite results files.

    .venv/bin/python benchmarks/fit_catalog.py benchmarks/gpu_<device>_<date>.json [...] [--write]

Each tunelab row of a suite that ran against a catalog peak gives one catalog row: its device class, method,
compile, grad_ckpt, model size and the efficiency that makes plan predict its measured rate
(bench/calibrate.suite_efficiencies). Prints the rows and what was left out; `--write` replaces the fitted
classes' rows in measured.yaml and keeps the other classes'. Commit the suite files with the catalog change.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
MEASURED = REPO / "src" / "tunelab" / "plan" / "catalog" / "measured.yaml"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("suites", nargs="+", type=Path, help="bench --suite results (.json)")
    p.add_argument("--write", action="store_true", help=f"update {MEASURED.relative_to(REPO)}")
    p.add_argument("--catalog", type=Path, default=MEASURED, help=argparse.SUPPRESS)  # tests write elsewhere
    args = p.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from tunelab.bench.calibrate import suite_efficiencies

    fitted: dict[str, list[dict]] = {}
    for path in args.suites:
        doc = json.loads(path.read_text())
        if not doc.get("complete", True):
            print(f"{path}: a partial run (complete: false); its finished rows count", file=sys.stderr)
        name = path.resolve().relative_to(REPO) if path.resolve().is_relative_to(REPO) else path
        rows, left_out = suite_efficiencies(doc, str(name))
        for device_class, found in rows.items():
            fitted.setdefault(device_class, []).extend(found)
        for line in left_out:
            print(f"{path}: left out {line}", file=sys.stderr)
    for device_class, rows in fitted.items():
        for r in rows:
            print(
                f"{device_class}: {r['method']}{' compiled' if r['compile'] else ''}"
                f"{' grad_ckpt' if r['grad_ckpt'] else ''} at {r['params'] / 1e9:.2f}B: efficiency {r['efficiency']}"
            )
    if args.write and fitted:
        text = args.catalog.read_text()
        header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
        classes = {**(yaml.safe_load(text) or {}).get("classes", {}), **fitted}
        args.catalog.write_text(header + yaml.safe_dump({"classes": classes}, sort_keys=True, width=120))
        print(f"wrote {len(fitted)} classes to {args.catalog}", file=sys.stderr)
    return 0 if fitted else 1


if __name__ == "__main__":
    sys.exit(main())
