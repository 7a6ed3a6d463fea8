"""`tunelab train --config C.yaml [key=value ...]`: fine-tune, then print the run's summary as one JSON line."""

from __future__ import annotations

import argparse
import json

from .. import config as cfgmod
from .. import hub
from ..recipes.train import train


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="YAML config (see configs/)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. lora.r=32 lr=1e-4")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument(
        "--offline",
        action="store_true",
        help="no downloads: hub models and datasets only from the local cache (as HF_HUB_OFFLINE=1)",
    )


def run(args: argparse.Namespace) -> int:
    if args.offline:
        hub.go_offline()
    cfg = cfgmod.load_config(args.config, args.overrides)
    summary = train(cfg, show_progress=not args.quiet)
    keys = ["output_dir", "steps", "loss_last", "tokens_nonpad_per_s", "peak_memory_bytes", "elapsed_s"]
    if summary["best_step"] is not None:
        keys += ["best_step", "best_eval_loss", "early_stopped"]
    print(json.dumps({k: summary[k] for k in keys}))
    return 0
