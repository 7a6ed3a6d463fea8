"""`tunelab plan`: time, memory and cost of a fine-tune on any GPU, before it runs.

Reads the config and flags; the prediction itself is recipes/predict.py's and plan/'s formulas.
"""

from __future__ import annotations

import argparse
import sys
import typing

from .. import config as cfgmod
from .. import hub
from ..errors import TunelabError
from ..plan import hfstack, readers, render
from ..plan.grpo import grpo_workload
from ..plan.job import STACKS
from ..recipes.predict import (
    DEFAULT_GPU,
    DEFAULT_LOSS_FRACTION,
    DEFAULT_MEAN_TOKENS,
    PlanRequest,
    plan_config,
    plan_generating,
)

READER_NAMES = tuple(readers.READERS)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides, e.g. lora.r=16")
    p.add_argument("--config", help="training config YAML (the same file `tunelab train` reads)")
    p.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE",
        help="another tool's own config (Axolotl, LLaMA-Factory, TRL, torchtune): predict its run; every key plan "
        "does not model is listed",
    )
    p.add_argument(
        "--tool", choices=READER_NAMES, help="with --from: which tool's file it is (default: told by its keys)"
    )
    p.add_argument(
        "--gpu", default=DEFAULT_GPU, help=f"catalog id(s), comma-separated, or `local` (default {DEFAULT_GPU})"
    )
    p.add_argument("--gpus", type=int, default=1, help="GPUs per run: >1 adds DDP / ZeRO-2 / ZeRO-3 estimates")
    p.add_argument("--json", action="store_true", help="one JSON line per GPU")
    p.add_argument("--format", choices=("table", "md"), default="table", help="table (terminal) or md (performance.md)")
    for key, (tp, help_text) in cfgmod.cli_keys().items():
        _setting_flag(p, key, tp, help_text)
    p.add_argument("--examples", type=int, help="number of training examples (when there is no data.path)")
    p.add_argument(
        "--mean-tokens",
        type=float,
        default=None,
        help=f"mean tokens per example without a dataset (default {DEFAULT_MEAN_TOKENS} or seq_len if shorter, an "
        "assumption)",
    )
    p.add_argument(
        "--loss-fraction",
        type=float,
        default=DEFAULT_LOSS_FRACTION,
        help="fraction of an example's tokens with a loss target, without a dataset",
    )
    p.add_argument("--tokenizer", help="model whose tokenizer measures data.path when the model itself is not local")
    p.add_argument(
        "--stack",
        choices=STACKS,
        default="tunelab",
        help="tunelab, or hf-peft: an HF Trainer + PEFT script with the same settings on the same GPU (its choices: "
        "--hf)",
    )
    p.add_argument(
        "--hf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --stack hf-peft, the script's choice by its TrainingArguments name: attn_implementation="
        f"{'|'.join(hfstack.ATTENTION)}, padding={'|'.join(hfstack.PADDING)}, group_by_length, "
        f"optim={'|'.join(hfstack.OPTIMS)}, use_liger_kernel, or a tunelab setting's HF name "
        "(gradient_checkpointing=true, per_device_train_batch_size=4, bf16=true), or a YAML file of them; repeatable",
    )
    p.add_argument("--price-per-hour", type=float, help="your own price per GPU-hour (replaces the catalog's)")
    grpo = p.add_argument_group("objective grpo (defaults: upper bounds)")
    grpo.add_argument(
        "--completion-tokens",
        type=float,
        help="decode steps per generation batch: the longest completion's tokens (default max_completion_length)",
    )
    grpo.add_argument(
        "--signal-share",
        type=float,
        help="share of completions whose group's rewards differ, the ones the update runs on with beta 0 (default 1)",
    )
    grpo.add_argument(
        "--from-run",
        metavar="DIR",
        help="take both from a GRPO run's metrics.jsonl (a few steps of the same config calibrate them), and on "
        "--gpu local its sampling and update speed too",
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="no downloads: hub models and datasets only from the local cache (as HF_HUB_OFFLINE=1)",
    )


def _setting_flag(p: argparse.ArgumentParser, key: str, tp, help_text: str) -> None:
    """`--seq-len` for the config key `seq_len`, `--lora-r` for `lora.r`: a flag is one more way to write a
    dotted override, so config/ validates it like any other (its choices, its type, its range)."""
    flag = "--" + key.replace(".", "-").replace("_", "-")
    dest = "setting:" + key
    help_text = f"{help_text or 'the config key ' + key} (the override {key}=...)"
    if tp is bool:
        p.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        return
    choices = typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else None
    metavar = None if choices else key.rsplit(".", 1)[-1].upper()
    p.add_argument(flag, dest=dest, choices=choices, metavar=metavar, default=None, help=help_text)


def config_from_args(args: argparse.Namespace, reading: readers.Reading | None = None) -> cfgmod.TrainConfig:
    # `--hf` names that are tunelab settings (gradient_checkpointing, ...) are overrides like any other.
    hf = getattr(args, "hf", [])
    overrides = [*args.overrides, *([] if isinstance(hf, dict) else hfstack.parse(hf)[1])]
    for dest, value in vars(args).items():
        if dest.startswith("setting:") and value is not None:
            key = dest.removeprefix("setting:")
            overrides.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    if reading is not None:
        return readers.config_of(reading, overrides)
    return cfgmod.load_config(args.config, overrides)


def run(args: argparse.Namespace) -> int:
    if args.offline:
        hub.go_offline()
    reading = None
    if args.from_file is not None:
        if args.config is not None or args.stack != "tunelab" or args.hf:
            raise TunelabError(
                "--from reads the tool's own file and its stack: drop --config, --stack and --hf (overrides apply)"
            )
        reading = readers.read(args.from_file, args.tool)
        args.stack, args.hf = reading.stack, readers.hf_choices(reading)
    request = PlanRequest(
        gpu=args.gpu,
        gpus=args.gpus,
        examples=args.examples,
        mean_tokens=args.mean_tokens,
        loss_fraction=args.loss_fraction,
        tokenizer=args.tokenizer or (reading.tokenizer if reading is not None else None),
        stack=args.stack,
        hf=args.hf if isinstance(args.hf, dict) else list(args.hf),
        parts=dict(reading.parts) if reading is not None else {},
        price_per_hour=args.price_per_hour,
        scenarios=args.format == "md" and not args.json,
        grpo=grpo_workload(args.completion_tokens, args.signal_share, args.from_run),
    )
    request.check_gpus()  # unknown ids fail before any slow work (reading the config's dataset, the local probe)
    cfg = config_from_args(args, reading)
    if cfg.objective.row.generates:  # a GRPO run: sampling, scoring passes and the update, by part
        plans = plan_generating(cfg, request)
        json_line, markdown, table = render.generating_json_line, render.generating_markdown, render.generating_table
    else:
        plans = plan_config(cfg, request)
        json_line, markdown, table = render.json_line, render.markdown, render.table
    if args.json:
        for p in plans:
            print(json_line(p))
    elif args.format == "md":
        print(markdown(plans, args.config or args.from_file or cfg.model))
    else:
        print(table(plans))
    if reading is not None:  # every key of the tool's file that the prediction does not model, one a line
        print("\n".join(reading.lines()), file=sys.stderr if args.json else sys.stdout)
    return 0
