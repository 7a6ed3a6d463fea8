"""The table of benchmarks/scripts/optimizers.sh's runs: each run's loss curve, final loss and measured peak beside
plan's peak for the same config on this machine (`tunelab plan --config <run>/config.yaml --gpu local`).

    PYTHONPATH=src python benchmarks/scripts/optimizers_table.py /tmp/optim-bench > out.json
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

from tunelab.cli import main


def plan_peak(config: Path) -> int:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--config", str(config), "--gpu", "local", "--json"]) == 0
    return json.loads(out.getvalue().splitlines()[0])["peak_memory_bytes"]


def main_(root: Path) -> None:
    rows = []
    for run in sorted(p for p in root.iterdir() if (p / "summary.json").is_file() and p.name != "probe"):
        summary = json.loads((run / "summary.json").read_text())
        curve = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
        predicted = plan_peak(run / "config.yaml")
        measured = summary["peak_memory_bytes"]
        rows.append(
            {
                "run": run.name,
                "loss_curve": curve,
                "loss_last": curve[-1],
                "peak_measured_bytes": measured,
                "peak_plan_bytes": predicted,
                "plan_error": predicted / measured - 1,
                "tokens_nonpad_per_s": summary["tokens_nonpad_per_s"],
            }
        )
    json.dump(rows, sys.stdout, indent=1)


if __name__ == "__main__":
    main_(Path(sys.argv[1]))
