"""Python's garbage collections inside the training loop, with the heap frozen (train/loop.py) and without.

Runs the same short training twice in one process, interleaved per round, and records every collection that
starts while `loop.run` is running: its generation and duration. Full (generation 2) collections scan every
tracked object, so with a model and its libraries loaded one lands as a stall in whichever step it hits.

    PYTHONPATH=src python benchmarks/scripts/gc_stalls.py --rounds 2 [key=value ...] > result.json
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/quickstart.yaml")
    p.add_argument("--rounds", type=int, default=2)
    args, overrides = p.parse_known_args()
    import torch

    from tunelab.config import load_config
    from tunelab.recipes.finetune import finetune
    from tunelab.train import loop

    in_loop = [False]
    events: list[tuple[int, float]] = []
    started: list[float] = []

    def watch(phase, info):
        if phase == "start":
            started.append(time.perf_counter())
        elif in_loop[0]:
            events.append((info["generation"], time.perf_counter() - started[-1]))

    real_run, real_freeze = loop.run, loop.freeze_heap

    def timed_run(ctx):
        in_loop[0] = True
        try:
            return real_run(ctx)
        finally:
            in_loop[0] = False

    loop.run = timed_run
    gc.callbacks.append(watch)
    rows = []
    for r in range(args.rounds):
        for frozen in (True, False):
            loop.freeze_heap = real_freeze if frozen else (lambda: None)
            events.clear()
            with TemporaryDirectory() as out:
                cfg = load_config(args.config, [*overrides, f"output_dir={out}"])
                summary = finetune(cfg, show_progress=False)
            full = [d for g, d in events if g == 2]
            rows.append(
                {
                    "round": r,
                    "heap_frozen": frozen,
                    "steps": summary["steps"],
                    "train_s": summary["train_s"],
                    "collections": {g: sum(1 for e in events if e[0] == g) for g in (0, 1, 2)},
                    "young_s": sum(d for g, d in events if g < 2),
                    "full_s": sum(full),
                    "full_max_s": max(full, default=0.0),
                    "step_time_median_s": summary.get("step_time_median_s"),
                    "step_time_max_s": summary.get("step_time_max_s"),
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr)
    print(
        json.dumps(
            {
                "device": platform.processor() or platform.machine(),
                "python": platform.python_version(),
                "torch": torch.__version__,
                "config": str(Path(args.config)),
                "overrides": overrides,
                "rows": rows,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
