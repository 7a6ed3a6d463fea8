"""`tunelab plan`: time, memory and cost of a fine-tune on any GPU, before it runs.

Reads the config and flags; the prediction itself is recipes/predict.py's and plan/'s formulas.
"""

from __future__ import annotations

import argparse
import math
import typing
from dataclasses import replace

from .. import config as cfgmod
from .. import hub
from ..errors import TunelabError
from ..plan import catalog, render, workload
from ..plan.estimate import STACKS, Device, Job, estimate, suggestions
from ..recipes.predict import dataset_lengths, eval_file_lengths, local_device
from ..sources import resolve_arch

DEFAULT_GPU = "h100-sxm"
# Without a dataset: every example is assumed this many tokens long, half of them with a loss target.
# Printed as assumptions; give data.path for real lengths.
DEFAULT_MEAN_TOKENS = 256
DEFAULT_LOSS_FRACTION = 0.5
SHARDINGS = ("ddp", "zero2", "zero3")
SCENARIO_EXAMPLES = (10_000, 50_000, 100_000)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides, e.g. lora.r=16")
    p.add_argument("--config", help="training config YAML (the same file `tunelab train` reads)")
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
        help="tunelab, or hf-peft: the tuned HF Trainer + PEFT recipe (padded batches, eager) on the same GPU",
    )
    p.add_argument("--price-per-hour", type=float, help="your own price per GPU-hour (replaces the catalog's)")
    p.add_argument(
        "--offline",
        action="store_true",
        help="no downloads: hub models and datasets only from the local cache (as HF_HUB_OFFLINE=1)",
    )


def _setting_flag(p: argparse.ArgumentParser, key: str, tp, help_text: str) -> None:
    """`--seq-len` for the config key `seq_len`, `--lora-r` for `lora.r`: a flag is one more way to write a
    dotted override, so config.py validates it like any other (its choices, its type, its range)."""
    flag = "--" + key.replace(".", "-").replace("_", "-")
    dest = "setting:" + key
    help_text = f"{help_text or 'the config key ' + key} (the override {key}=...)"
    if tp is bool:
        p.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        return
    choices = typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else None
    metavar = None if choices else key.rsplit(".", 1)[-1].upper()
    p.add_argument(flag, dest=dest, choices=choices, metavar=metavar, default=None, help=help_text)


def config_from_args(args: argparse.Namespace) -> cfgmod.TrainConfig:
    overrides = list(args.overrides)
    for dest, value in vars(args).items():
        if dest.startswith("setting:") and value is not None:
            key = dest.removeprefix("setting:")
            overrides.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    return cfgmod.load_config(args.config, overrides)


def lengths_from(cfg: cfgmod.TrainConfig, args: argparse.Namespace) -> workload.Lengths:
    if cfg.data.given:
        if args.examples is not None or args.mean_tokens is not None:
            raise TunelabError(
                "--examples/--mean-tokens describe a dataset you do not have; data.path is set, drop them (or set data.path=null)"
            )
        return dataset_lengths(cfg, args.tokenizer)
    if args.examples is None:
        raise TunelabError("no workload: set data.path (real token lengths) or give --examples N [--mean-tokens M]")
    if args.examples < 1:
        raise TunelabError(f"--examples must be at least 1, got {args.examples}")
    # The default assumption fits the run's rows: a shorter seq_len is read as shorter examples, not truncation.
    mean = min(DEFAULT_MEAN_TOKENS, cfg.batch.seq_len) if args.mean_tokens is None else args.mean_tokens
    if not 1 <= mean < math.inf:  # written so that nan, which compares false, fails too
        raise TunelabError(f"--mean-tokens must be at least 1, got {mean}")
    if not 0 < args.loss_fraction <= 1:
        raise TunelabError(f"--loss-fraction must be in (0, 1], got {args.loss_fraction}")
    assumed = workload.assumed_lengths(args.examples, mean, args.loss_fraction)
    if cfg.eval.split is not None:
        return workload.split_assumed(assumed, cfg.eval.split)
    if cfg.eval.path is not None:
        return replace(assumed, held_out=eval_file_lengths(cfg, args.tokenizer))
    return assumed


def device_for(gpu_id: str, precision: str) -> Device:
    if gpu_id != "local":
        return Device(catalog.gpu(gpu_id), catalog.runtime_overhead("cuda"))
    return local_device(precision)


def run(args: argparse.Namespace) -> int:
    if args.offline:
        hub.go_offline()
    if args.gpus < 1:
        raise TunelabError(f"--gpus must be at least 1, got {args.gpus}")
    gpu_ids = [g.strip() for g in args.gpu.split(",") if g.strip()]
    if not gpu_ids:
        raise TunelabError("--gpu is empty; name catalog ids like h100-sxm,rtx-4090 or `local`")
    for g in gpu_ids:  # unknown ids fail before any slow work (the local probe, reading a dataset)
        if g != "local":
            catalog.gpu(g)
    cfg = config_from_args(args)
    # The local probe measures this machine in the run's own precision (fp16 on a CPU fails as train fails).
    devices = [device_for(g, cfg.compute.precision) for g in gpu_ids]
    if args.gpus > 1 and any(d.gpu.device_type == "cpu" for d in devices):
        raise TunelabError(
            f"--gpus {args.gpus} with --gpu local on a CPU: the processes would share this machine's cores, so "
            "nothing scales; --gpus predicts several GPUs (name catalog ids)"
        )
    arch = resolve_arch(cfg.model)
    lengths = lengths_from(cfg, args)
    results = []
    for device in devices:
        job = Job.of(cfg, stack=args.stack)
        single = estimate(arch, lengths, job, device)
        multi = []
        if args.gpus > 1:
            # FSDP (fsdp2.yaml, the zero3 row) shards floating-point weights only: no zero3 over an nf4/int8 base.
            for strategy in SHARDINGS if cfg.adapter.quant == "none" else SHARDINGS[:2]:
                multi.append(
                    estimate(arch, lengths, job, device, args.gpus, strategy, catalog.scaling_efficiency(strategy))
                )
        prices = price_rows(device.gpu.id, args.price_per_hour)
        scenarios = None
        if args.format == "md" and not args.json:
            scenarios = [(n, estimate(arch, scaled(lengths, n), job, device)) for n in SCENARIO_EXAMPLES]
        results.append(render.Result(arch, single, multi, suggestions(arch, lengths, single), prices, scenarios))
    if args.json:
        for r in results:
            print(render.json_line(r))
    elif args.format == "md":
        print(render.markdown(results, args.config or cfg.model))
    else:
        print(render.table(results))
    return 0


def price_rows(gpu_id: str, override: float | None) -> list[catalog.Price]:
    if override is not None:
        if not 0 < override < math.inf:
            raise TunelabError(f"--price-per-hour must be a positive number, got {override}")
        return [catalog.Price("user", gpu_id, override, 1, "given", "--price-per-hour")]
    return catalog.prices(gpu_id)


def scaled(lengths: workload.Lengths, examples: int) -> workload.Lengths:
    """The same mean example (and loss share) at another dataset size, for the md scenarios."""
    return workload.Lengths(
        examples,
        lengths.mean_tokens,
        lengths.mean_loss_tokens,
        source=f"{examples} examples of the mean length {lengths.mean_tokens:.1f}",
        held_out=lengths.held_out,
    )
