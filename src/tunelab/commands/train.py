"""`tunelab train --config C.yaml [key=value ...]`: fine-tune, then print the run's summary as one JSON line.

`--nproc N` starts the same command on N data-parallel processes through `accelerate launch`; running
`accelerate launch [--config_file F] -m tunelab.cli train ...` directly does the same.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import config as cfgmod
from .. import hub, objectives
from ..errors import TunelabError
from ..plan import readers


def add_arguments(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="YAML config (see configs/)")
    source.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE",
        help="another tool's own config (Axolotl, LLaMA-Factory, TRL, torchtune): train the same job with tunelab, "
        "after plan's prediction of both runs on this machine",
    )
    p.add_argument("--tool", choices=tuple(readers.READERS), help="with --from: which tool's file it is")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. lora.r=32 lr=1e-4")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="data-parallel processes (one per GPU; gloo processes on CPU): relaunches through accelerate launch",
    )
    p.add_argument(
        "--accelerate-config",
        metavar="FILE",
        help="Accelerate config (configs/accelerate/: ddp, fsdp2, zero2, zero3), run with its num_processes unless "
        "--nproc says otherwise; without one, --nproc runs plain DDP",
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="no downloads: hub models and datasets only from the local cache (as HF_HUB_OFFLINE=1)",
    )


def run(args: argparse.Namespace) -> int:
    if args.offline:
        hub.go_offline()
    if args.nproc is not None or args.accelerate_config is not None:
        if args.from_file is not None:
            raise TunelabError("--from runs one process; write the config (tunelab plan --from) to launch several")
        return _launch(args)
    from ..recipes import entry
    from ..train.distributed import exit_launched, is_main

    if args.from_file is not None:
        reading = readers.read(args.from_file, args.tool)
        cfg = readers.config_of(reading, args.overrides)
        _predict_both(cfg, reading)
    else:
        cfg = cfgmod.load_config(args.config, args.overrides)
    summary = entry.train(cfg, show_progress=not args.quiet).as_dict()
    keys = ["output_dir", "steps", "loss_last", "tokens_nonpad_per_s", "peak_memory_bytes", "elapsed_s"]
    if summary["best_step"] is not None:
        keys += ["best_step", "best_eval_loss", "early_stopped"]
    if summary.get("time_limited"):
        keys.append("time_limited")
    if is_main():
        print(json.dumps({k: summary[k] for k in keys}))
    return exit_launched()


def _predict_both(cfg: cfgmod.TrainConfig, reading: readers.Reading) -> None:
    """plan's prediction on this machine for the other tool's run and for tunelab's, side by side, and every key
    of the tool's file plan did not model, before training."""
    from ..plan.render import side_by_side
    from ..recipes.predict import PlanRequest, plan_config

    request = PlanRequest(gpu="local", stack=reading.stack, hf=readers.hf_choices(reading))
    print("\n".join([*side_by_side(plan_config(cfg, request)[0], reading.label), *reading.lines()]), flush=True)


def _launch(args: argparse.Namespace) -> int:
    """Run this command again under `accelerate launch` with N processes; its exit status is the launcher's."""
    from ..train.launch import (
        check_deepspeed_run,
        check_fsdp_run,
        check_prompt_shares,
        launch_command,
        read_accelerate_config,
        run_launcher,
    )
    from ..train.lock import removed_if_abandoned

    cfg = cfgmod.load_config(args.config, args.overrides)  # a bad config fails here with one line, not N times
    refusal = objectives.lacking(cfg.objective.row, "processes", "run it without --nproc or --accelerate-config")
    if refusal and args.nproc != 1:
        raise TunelabError(refusal)
    launch = None if args.accelerate_config is None else read_accelerate_config(args.accelerate_config)
    nproc = args.nproc if args.nproc is not None else int((launch or {}).get("num_processes") or 1)
    check_prompt_shares(cfg, nproc, args.config or "config")
    if launch is not None and launch["distributed_type"] == "FSDP":
        check_fsdp_run(cfg, args.config)
    if launch is not None and launch["distributed_type"] == "DEEPSPEED":
        check_deepspeed_run(cfg, args.config)
    argv = ["train", "--config", args.config, *args.overrides]
    argv += (["--quiet"] if args.quiet else []) + (["--offline"] if args.offline else [])
    command = launch_command(args.nproc, args.accelerate_config, argv)
    with removed_if_abandoned(Path(cfg.run.output_dir)):  # a process the launcher killed leaves what it created
        return run_launcher(command)
