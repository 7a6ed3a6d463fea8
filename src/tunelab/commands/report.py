"""`tunelab report RUN_OR_DB... --out DIR`: stored runs -> DIR/performance.md with PNG plots."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..report.sections import load_inputs, write_report


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="RUN_OR_DB", help="run directories and/or bench SQLite databases")
    p.add_argument("--out", required=True, help="directory for performance.md and its plots")
    p.add_argument("--title", default="Performance report", help="heading of performance.md")


def run(args: argparse.Namespace) -> int:
    runs = load_inputs([Path(p) for p in args.inputs])
    written = write_report(runs, Path(args.out), args.title)
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0
