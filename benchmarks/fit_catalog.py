"""plan's fitted step-time constants (src/tunelab/plan/catalog/fitted.yaml) from GPU suite results files.

    .venv/bin/python benchmarks/fit_catalog.py benchmarks/gpu_<device>_<date>.json [...] [--write]

Adds each suite file's rows (tunelab rows that ran against a catalog peak, and the hf-trainer-tuned peer) to the
measured rows `benchmarks/scripts/plan_accuracy.py` fits, refits every device once in the fit and once left out, prints
the accuracy table, and with `--write` stores the fit in fitted.yaml, each device naming the rows it came from.
Commit the suite files, the catalog change and a new `benchmarks/plan-accuracy/plan-accuracy_<date>.{md,json}` together.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))

from plan_accuracy import main as accuracy  # noqa: E402


def main(argv: list[str]) -> int:
    """Suite files are positional; every other flag (--write, --out, --only-suites) is plan_accuracy.py's."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("suites", nargs="+", type=Path, help="bench --suite results (.json)")
    args, rest = p.parse_known_args(argv)
    return accuracy([x for s in args.suites for x in ("--suite", str(s))] + rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
