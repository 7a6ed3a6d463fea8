"""Does a calibrated plan predict a real run's training time? `bench --calibrate` on the present device, then
`tunelab train` for a run of another length, with plan's predicted time beside the measured one.

    .venv/bin/python benchmarks/scripts/calibration.py [--steps 60] [--out FILE.json] [key=value ...]

The workload is the embedded SmolLM2-135M on 400 additions; overrides change it (e.g. `model=random:llama-3.2-1b
seq_len=2048` on a GPU). The calibration record goes to a temporary cache, so the user's is left alone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

SHAPE = ["method=lora", "seq_len=128", "micro_batch=2", "precision=auto", "data.template=compact"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="optimizer steps of the checked run")
    p.add_argument("--calibrate-steps", type=int, default=12)
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    args, overrides = p.parse_known_args()
    work = Path(tempfile.mkdtemp(prefix="tunelab-calibration-"))
    os.environ["TUNELAB_CACHE"] = str(work / "cache")
    from tunelab.cli import main as cli
    from tunelab.config import load_config
    from tunelab.libraries import quiet_libraries
    from tunelab.recipes.predict import local_prediction
    from tunelab.recipes.train import train

    quiet_libraries()
    r = random.Random(0)
    data = work / "add.jsonl"
    data.write_text(
        "".join(
            json.dumps({"instruction": f"{a} + {b}", "output": f"{a} + {b} = {a + b}"}) + "\n"
            for a, b in ((r.randint(0, 10**8), r.randint(0, 10**8)) for _ in range(400))
        )
    )
    common = [f"data.path={data}", *SHAPE, *overrides]
    checked = load_config(None, [*common, f"max_steps={args.steps}", f"output_dir={work / 'run'}"])
    before = local_prediction(checked)  # the step model's constants for this device's class, uncalibrated
    if (
        cli(
            [
                "bench",
                "--calibrate",
                *common,
                f"output_dir={work / 'cal'}",
                "--methods",
                "lora",
                "--steps",
                str(args.calibrate_steps),
            ]
        )
        != 0
    ):
        return 1
    cfg = load_config(None, [*common, f"max_steps={args.steps}", f"output_dir={work / 'run'}"])
    prediction = local_prediction(cfg)
    summary = train(cfg, show_progress=False)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "device": summary["device"],
        "overrides": common[1:],
        "steps": args.steps,
        "predicted_train_s": prediction.speed.train_s,
        "measured_train_s": summary["train_s"],
        "error": prediction.speed.train_s / summary["train_s"] - 1,
        "efficiency": prediction.efficiency.label,
        "uncalibrated_train_s": before.speed.train_s,
        "uncalibrated_error": before.speed.train_s / summary["train_s"] - 1,
        "uncalibrated_source": before.efficiency.label,
        "measured_step_time_median_s": summary["step_time_median_s"],
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
