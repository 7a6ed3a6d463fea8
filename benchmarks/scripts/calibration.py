"""Does a calibrated plan predict a real run's training time? `bench calibrate` on the present device (one
shape), then `tunelab train` runs of other lengths and shapes (--check), each with plan's predicted time beside
the measured one: calibrated as plan does now (the step model times the measured/modeled step ratio), with the
same record's flat efficiency (what older plans did), and uncalibrated.

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
from dataclasses import asdict, replace
from pathlib import Path

SHAPE = ["method=lora", "seq_len=128", "micro_batch=2", "precision=auto", "data.template=compact"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="optimizer steps of the checked run")
    p.add_argument("--calibrate-steps", type=int, default=12)
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    p.add_argument(
        "--check",
        nargs="*",
        default=["", "micro_batch=8", "seq_len=256 micro_batch=4", "method=full"],
        help="shapes of the checked runs, each a space-separated list of overrides ('' = the calibrated one)",
    )
    args, overrides = p.parse_known_args()
    work = Path(tempfile.mkdtemp(prefix="tunelab-calibration-"))
    os.environ["TUNELAB_CACHE"] = str(work / "cache")
    from tunelab.cli import main as cli
    from tunelab.config import load_config
    from tunelab.device import device_name, pick_device
    from tunelab.libraries import quiet_libraries
    from tunelab.plan.calibration import device_key, load_calibration, save_calibration
    from tunelab.recipes.finetune import finetune
    from tunelab.recipes.predict import local_prediction

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
    shapes = [c.split() for c in args.check]
    before = [
        local_prediction(checked_config(load_config, common, extra, args.steps, work, i))
        for i, extra in enumerate(shapes)
    ]  # the step model's constants for this device's class, uncalibrated
    methods = ",".join(
        sorted({"lora", *(x.removeprefix("method=") for e in shapes for x in e if x.startswith("method="))})
    )
    calibrate = [
        "bench",
        "calibrate",
        *common,
        f"output_dir={work / 'cal'}",
        "--methods",
        methods,
        "--steps",
        str(args.calibrate_steps),
    ]
    if cli(calibrate) != 0:
        return 1
    record = load_calibration(device_key(device_name(pick_device("auto"))))
    rows = []
    for i, extra in enumerate(shapes):
        cfg = checked_config(load_config, common, extra, args.steps, work, i)
        prediction = local_prediction(cfg)
        save_calibration(replace(record, step_scale={}))  # the same record, as older plans read it
        flat = local_prediction(cfg)
        save_calibration(record)
        summary = finetune(cfg, show_progress=False)
        measured = summary["train_s"]
        rows.append(
            {
                "shape": " ".join(extra) or "the calibrated shape",
                "steps": args.steps,
                "measured_train_s": measured,
                "measured_step_time_median_s": summary["step_time_median_s"],
                "predicted_train_s": prediction.speed.train_s,
                "error": prediction.speed.train_s / measured - 1,
                "source": prediction.efficiency.label,
                "flat_efficiency_train_s": flat.speed.train_s,
                "flat_efficiency_error": flat.speed.train_s / measured - 1,
                "uncalibrated_train_s": before[i].speed.train_s,
                "uncalibrated_error": before[i].speed.train_s / measured - 1,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "device": record.device_name,
        "overrides": common[1:],
        "calibrated_on": SHAPE + overrides,
        "calibration": asdict(record),
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def checked_config(load_config, common: list[str], extra: list[str], steps: int, work: Path, i: int):
    return load_config(None, [*common, *extra, f"max_steps={steps}", f"output_dir={work / f'run-{i}'}"])


if __name__ == "__main__":
    sys.exit(main())
