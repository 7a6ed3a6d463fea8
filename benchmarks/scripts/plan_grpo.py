"""plan's GRPO prediction beside measured GRPO runs, by part, under the shipped GRPO constants
(src/tunelab/plan/catalog/grpo.yaml). The fit itself is `tunelab bench fit` (plan/grpo_fit.py), which refits them
with the step-time constants from the `grpo` entries of benchmarks/plan-accuracy/rows/ and, with --write, stores
them; this script writes nothing under src/.

    python benchmarks/scripts/plan_grpo.py [ROW_FILE ...] [--out FILE.md]

Each ROW_FILE's `grpo` entries (bench/fit_data.py: the run's folder, its device class, probes and prompts) are
predicted on their own device; default: every row file of benchmarks/plan-accuracy/rows/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tunelab.bench.fit_data import grpo_run, read_file
from tunelab.markdown import table
from tunelab.plan import catalog, grpo_fit

ROWS = Path(__file__).resolve().parents[1] / "plan-accuracy" / "rows"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--out", type=Path, help="append the table to this markdown file")
    args = p.parse_args(argv)
    files = args.files or sorted(ROWS.glob("*.yaml"))
    runs = [grpo_run(f, i, e) for f in files for i, e in enumerate(read_file(f).get("grpo", []))]
    rows = [row for run in runs for row in grpo_fit.table_rows(run, catalog.grpo_constants(run.device))]
    text = "\n".join(table(["GRPO run", "part", "plan s", "measured s", "plan vs measured"], rows))
    print(text)
    if args.out:
        with args.out.open("a") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
