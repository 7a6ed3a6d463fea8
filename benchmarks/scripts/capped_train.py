"""`tunelab train` under a GPU memory cap, standing in for a smaller card (issue 47: an RTX 4090's 24 GiB on a
larger GPU): torch.cuda.set_per_process_memory_fraction before anything allocates, then the CLI as usual, then
plan's peak for the same config beside the measured one.

    python benchmarks/scripts/capped_train.py --cap-gib 24 --out result.json -- train key=value ...
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cap-gib", type=float, default=24.0)
    parser.add_argument("--out", required=True)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    import torch

    from tunelab.cli import main as cli

    argv = [a for a in args.argv if a != "--"]
    capped = torch.cuda.is_available()
    if capped:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * 2**30 / total))
    code = cli(argv)
    out_dir = Path(next(a.split("=", 1)[1] for a in argv if a.startswith("output_dir=")))
    summary = json.loads((out_dir / "summary.json").read_text()) if (out_dir / "summary.json").is_file() else {}
    text = io.StringIO()
    gpu = "rtx-4090" if capped else "local"
    with contextlib.redirect_stdout(text):
        cli(["plan", "--config", str(out_dir / "config.yaml"), "--gpu", gpu, "--json"])
    lines = text.getvalue().splitlines()
    plan = json.loads(lines[0]) if lines else {}
    record = {
        "cap_gib": args.cap_gib if capped else None,
        "exit": code,
        "peak_measured_bytes": summary.get("peak_memory_bytes"),
        "tokens_nonpad_per_s": summary.get("tokens_nonpad_per_s"),
        "peak_plan_bytes": plan.get("peak_memory_bytes"),
        "argv": argv,
    }
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(json.dumps(record))
    return code


if __name__ == "__main__":
    sys.exit(main())
