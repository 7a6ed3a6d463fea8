"""After `tunelab bench calibrate` at a run's own config, does plan predict that run's training time within 10%?

The user's sequence on the present device, timed: plan's prediction from the fitted constants of the device's
class, the calibration probe (`tunelab bench calibrate --config CONFIG --methods <its method>`), plan again
(now scaled by the probe's measured/modeled step), then the run itself (`tunelab train --config CONFIG`, a
process of its own as a user runs it). Each prediction is plan's training time as the loop measures it
(torch.compile's first steps included, as `make demo` compares it).

    .venv/bin/python benchmarks/scripts/calibrated_run.py configs/quickstart.yaml [--probe-steps 8]
        [--out FILE.json] [key=value ...]

The quickstart's data is written as `make demo` writes it (commands/demo.write_data) when the config's file is
missing. The calibration record goes to a temporary cache, so the user's is left alone; the rest of the user's
cache (converted models, tokenizers) is linked into it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", type=Path)
    p.add_argument("--probe-steps", type=int, default=8, help="measured steps of the calibration probe")
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    args, overrides = p.parse_known_args()
    work = Path(tempfile.mkdtemp(prefix="tunelab-calibrated-run-"))
    os.environ["TUNELAB_CACHE"] = str(own_cache(work / "cache"))
    from rich.console import Console

    from tunelab.commands.demo import train_s, write_data
    from tunelab.config import load_config
    from tunelab.device import cpu_class, device_name, pick_device
    from tunelab.errors import TunelabError
    from tunelab.io import write_atomic
    from tunelab.libraries import quiet_libraries
    from tunelab.recipes.predict import local_prediction

    quiet_libraries()
    overrides = [*overrides, f"output_dir={work / 'run'}"]
    try:
        cfg = load_config(args.config, overrides)
    except TunelabError as e:
        print(f"calibrated_run: error: {e}", file=sys.stderr)
        return 2
    if not Path(cfg.data.path).exists():
        demo_args = argparse.Namespace(digits="1-8", train_rows=18_000, test_rows=400, response="aligned")
        write_data(demo_args, cfg, Console(stderr=True))
    device = pick_device(cfg.compute.device)
    before = local_prediction(cfg)
    cli = [sys.executable, "-m", "tunelab.cli"]
    probe = [
        *cli,
        "bench",
        "calibrate",
        "--config",
        str(args.config),
        *overrides[:-1],
        f"output_dir={work / 'probe'}",
        "--methods",
        cfg.adapter.method,
        "--steps",
        str(args.probe_steps),
    ]
    started = time.perf_counter()
    if subprocess.run(probe).returncode != 0:  # the command printed its own one-line error
        return 1
    probe_s = time.perf_counter() - started
    after = local_prediction(cfg)
    if subprocess.run([*cli, "train", "--config", str(args.config), *overrides, "--quiet"]).returncode != 0:
        return 1
    summary = json.loads((Path(cfg.run.output_dir) / "summary.json").read_text())
    measured = summary["train_s"]
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "device": device_name(device),
        "cpu_class": cpu_class() if device.type == "cpu" else None,
        "config": str(args.config),
        "overrides": overrides[:-1],
        "probe": {"command": " ".join(probe[2:]), "wall_s": round(probe_s, 1), "steps": args.probe_steps},
        "run": {
            "steps": summary["steps"],
            "train_s": measured,
            "step_time_median_s": summary["step_time_median_s"],
            "compile": summary.get("compile"),
        },
        "uncalibrated": {
            "train_s": train_s(before),
            "error": train_s(before) / measured - 1,
            "source": before.efficiency.label,
        },
        "calibrated": {
            "train_s": train_s(after),
            "error": train_s(after) / measured - 1,
            "source": after.efficiency.label,
            "compile_s": after.overheads.compile_s,
        },
    }
    print(json.dumps(result, indent=2))
    if args.out:
        write_atomic(args.out, [json.dumps(result, indent=2) + "\n"])
    return 0


def own_cache(path: Path) -> Path:
    """A cache of this script's own for calibration records, holding links to everything else of the user's."""
    from tunelab.io import tunelab_cache

    path.mkdir(parents=True)
    user = tunelab_cache()
    if user.is_dir():
        for entry in user.iterdir():
            if entry.name != "calibration":
                (path / entry.name).symlink_to(entry.resolve())
    return path


if __name__ == "__main__":
    sys.exit(main())
