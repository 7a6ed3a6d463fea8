"""`tunelab plan`: time, memory and cost of a fine-tune on any GPU, before it runs.

The one entry point that reads the config and flags; everything below it takes typed arguments.
"""

from __future__ import annotations

import argparse

from .. import config as cfgmod
from ..errors import TunelabError
from . import arch as archmod
from . import catalog, render, workload
from .estimate import Device, Settings, estimate, suggestions

DEFAULT_GPU = "h100-sxm"
# Without a dataset: every example is assumed this many tokens long, half of them with a loss target.
# Printed as assumptions; give data.path for real lengths.
DEFAULT_MEAN_TOKENS = 256
DEFAULT_LOSS_FRACTION = 0.5
SHARDINGS = ("ddp", "zero2", "zero3")
SCENARIO_EXAMPLES = (10_000, 50_000, 100_000)

# flag -> config key: flags become dotted overrides so validation lives in one place (config.py).
FLAG_KEYS = {"model": "model", "method": "method", "seq_len": "seq_len", "micro_batch": "micro_batch",
             "grad_accum": "grad_accum", "epochs": "epochs", "lora_r": "lora.r", "packing": "packing",
             "grad_ckpt": "grad_ckpt", "precision": "precision"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides, e.g. lora.r=16")
    p.add_argument("--config", help="training config YAML (the same file `tunelab train` reads)")
    p.add_argument("--gpu", default=DEFAULT_GPU, help=f"catalog id(s), comma-separated, or `local` (default {DEFAULT_GPU})")
    p.add_argument("--gpus", type=int, default=1, help="GPUs per run: >1 adds DDP / ZeRO-2 / ZeRO-3 estimates")
    p.add_argument("--json", action="store_true", help="one JSON line per GPU")
    p.add_argument("--format", choices=("table", "md"), default="table", help="table (terminal) or md (performance.md)")
    p.add_argument("--model")
    p.add_argument("--method", choices=cfgmod.METHODS)
    p.add_argument("--precision", choices=cfgmod.PRECISIONS)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--micro-batch", type=int)
    p.add_argument("--grad-accum", type=int)
    p.add_argument("--epochs", type=float)
    p.add_argument("--lora-r", type=int)
    p.add_argument("--packing", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--grad-ckpt", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--examples", type=int, help="number of training examples (when there is no data.path)")
    p.add_argument("--mean-tokens", type=float, default=None,
                   help=f"mean tokens per example without a dataset (default {DEFAULT_MEAN_TOKENS}, an assumption)")
    p.add_argument("--loss-fraction", type=float, default=DEFAULT_LOSS_FRACTION,
                   help="fraction of an example's tokens with a loss target, without a dataset")
    p.add_argument("--tokenizer", help="model whose tokenizer measures data.path when the model itself is not local")
    p.add_argument("--price-per-hour", type=float, help="your own price per GPU-hour (replaces the catalog's)")


def config_from_args(args: argparse.Namespace) -> cfgmod.TrainConfig:
    overrides = list(args.overrides)
    for flag, key in FLAG_KEYS.items():
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    return cfgmod.load_config(args.config, overrides)


def run_precision(precision: str, device: Device) -> str:
    """The precision a run picks on `device`: `auto` is bf16 where the device has it (a local CPU without bf16
    units computes in fp32, device.pick_precision), else fp16."""
    if precision != "auto":
        return precision
    if device.gpu.device_type == "cpu":
        return "bf16" if device.gpu.bf16 else "fp32"
    return "bf16" if device.gpu.bf16 else "fp16"


def settings_from_config(cfg: cfgmod.TrainConfig, arch: archmod.Arch, device: Device) -> Settings:
    if cfg.seq_len > arch.max_positions > 0:
        raise TunelabError(f"seq_len {cfg.seq_len} is over {arch.name}'s maximum of {arch.max_positions} positions; lower seq_len")
    compute_bytes = 4 if run_precision(cfg.precision, device) == "fp32" else 2  # bf16 and fp16 are both 2 bytes
    return Settings(
        method=cfg.method, base_quant=cfgmod.effective_base_quant(cfg), compute_bytes=compute_bytes,
        seq_len=cfg.seq_len, micro_batch=cfg.micro_batch, grad_accum=cfg.grad_accum, epochs=cfg.epochs,
        max_steps=cfg.max_steps, packing=cfg.packing, grad_ckpt=cfg.grad_ckpt,
        targets=archmod.adapter_targets(arch, cfg.lora.targets), r=cfg.lora.r, lora_dropout=cfg.lora.dropout,
        save_steps=cfg.save_steps, save_total_limit=cfg.save_total_limit, seed=cfg.seed, compile=cfg.compile, attention=cfg.attention,
    )


def lengths_from(cfg: cfgmod.TrainConfig, args: argparse.Namespace) -> workload.Lengths:
    if cfg.data.path is not None:
        if args.examples is not None or args.mean_tokens is not None:
            raise TunelabError("--examples/--mean-tokens describe a dataset you do not have; data.path is set, drop them (or set data.path=null)")
        return dataset_lengths(cfg, args.tokenizer)
    if args.examples is None:
        raise TunelabError("no workload: set data.path (real token lengths) or give --examples N [--mean-tokens M]")
    if args.examples < 1:
        raise TunelabError(f"--examples must be at least 1, got {args.examples}")
    mean = DEFAULT_MEAN_TOKENS if args.mean_tokens is None else args.mean_tokens
    if mean < 1:
        raise TunelabError(f"--mean-tokens must be at least 1, got {mean}")
    if not 0 < args.loss_fraction <= 1:
        raise TunelabError(f"--loss-fraction must be in (0, 1], got {args.loss_fraction}")
    return workload.assumed_lengths(args.examples, mean, args.loss_fraction)


def dataset_lengths(cfg: cfgmod.TrainConfig, tokenizer_ref: str | None) -> workload.Lengths:
    """Real lengths after the template and truncation, from the same pipeline (and cache) `train` uses."""
    from ..data.pipeline import DataSpec, prepare
    from .. import sources as load

    ref = tokenizer_ref or cfg.model
    try:
        tokenizer = load.load_tokenizer(load.resolve(ref))
    except TunelabError as e:
        raise TunelabError(f"{e} (plan needs the tokenizer to measure data.path; pass --tokenizer MODEL to measure with another local one)") from None
    data = prepare(DataSpec(cfg.data.path, cfg.data.format, cfg.data.template, cfg.data.train_on_inputs,
                            cfg.seq_len, cfg.data.max_examples), tokenizer)
    st = data.stats
    proxy = f", tokenized with {ref}'s tokenizer" if tokenizer_ref else ""
    return workload.Lengths(st.examples, st.mean_len, st.tokens_loss / st.examples,
                            source=f"dataset {cfg.data.path}: {st.rows} rows, {st.truncated} truncated, {st.dropped} dropped{proxy}",
                            lengths=data.lengths, truncated=st.truncated, dropped=st.dropped)


def device_for(gpu_id: str, precision: str) -> Device:
    if gpu_id != "local":
        return Device(catalog.gpu(gpu_id), catalog.runtime_overhead("cuda"))
    return local_device(precision)


def local_device(precision: str) -> Device:
    """The present machine: its peak from a calibration record, else a short matmul probe."""
    from ..device import device_memory_bytes, device_name, pick_device, pick_precision
    from ..bench.probe import matmul_peak
    from .calibration import device_key, load_calibration

    dev = pick_device("auto")
    prec = pick_precision(precision, dev)
    name = device_name(dev)
    record = load_calibration(device_key(name))
    if record is not None and record.peak_flops:
        peak, source = record.peak_flops, f"calibration record {record.created}"
    else:
        peak, n = matmul_peak(prec.compute, dev)
        source = f"measured now: {n}^3 {prec.name} matmul probe"
    cls = "probe-gpu" if dev.type == "cuda" else ("cpu" if prec.name == "bf16" else "cpu-fp32")
    overhead = catalog.runtime_overhead("cuda" if dev.type == "cuda" else "cpu")
    if record is not None and record.runtime_overhead_bytes is not None:
        overhead = record.runtime_overhead_bytes
    gpu = catalog.Gpu("local", name, device_memory_bytes(dev), 0.0, peak, prec.name == "bf16", cls,
                      source=source, peak_source=source)
    return Device(gpu, overhead, record)


def local_prediction(cfg: cfgmod.TrainConfig):
    """plan's estimate for a training config on the present device, as `plan --gpu local` computes it: what
    `bench` and the demo put beside their measurements."""
    arch = archmod.resolve_arch(cfg.model)
    device = local_device(cfg.precision)
    return estimate(arch, dataset_lengths(cfg, None), settings_from_config(cfg, arch, device), device)


def run(args: argparse.Namespace) -> int:
    if args.gpus < 1:
        raise TunelabError(f"--gpus must be at least 1, got {args.gpus}")
    gpu_ids = [g.strip() for g in args.gpu.split(",") if g.strip()]
    if not gpu_ids:
        raise TunelabError("--gpu is empty; name catalog ids like h100-sxm,rtx-4090 or `local`")
    devices = [device_for(g, "auto") for g in gpu_ids]  # unknown ids fail before any slow work
    cfg = config_from_args(args)
    arch = archmod.resolve_arch(cfg.model)
    lengths = lengths_from(cfg, args)
    results = []
    for device in devices:
        s = settings_from_config(cfg, arch, device)
        single = estimate(arch, lengths, s, device)
        multi = []
        if args.gpus > 1:
            for strategy in SHARDINGS:
                multi.append(estimate(arch, lengths, s, device, args.gpus, strategy, catalog.scaling_efficiency(strategy)))
        prices = price_rows(device.gpu.id, args.price_per_hour)
        scenarios = None
        if args.format == "md" and not args.json:
            scenarios = [(n, estimate(arch, scaled(lengths, n), s, device)) for n in SCENARIO_EXAMPLES]
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
        if override <= 0:
            raise TunelabError(f"--price-per-hour must be positive, got {override}")
        return [catalog.Price("user", gpu_id, override, 1, "given", "--price-per-hour")]
    return catalog.prices(gpu_id)


def scaled(lengths: workload.Lengths, examples: int) -> workload.Lengths:
    """The same mean example (and loss share) at another dataset size, for the md scenarios."""
    return workload.Lengths(examples, lengths.mean_tokens, lengths.mean_loss_tokens,
                            source=f"{examples} examples of the mean length {lengths.mean_tokens:.1f}")
