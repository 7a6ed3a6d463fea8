"""plan's prediction for a training config: the config read into plan's Settings, the dataset's real lengths,
the present machine as a plan Device; `tunelab plan`, bench and the demo all use it. Torch is imported only to
probe the local device."""

from __future__ import annotations

from .. import config as cfgmod
from ..errors import TunelabError
from ..plan import arch as archmod
from ..plan import catalog, workload
from ..plan.estimate import Device, Settings, estimate


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
        raise TunelabError(
            f"seq_len {cfg.seq_len} is over {arch.name}'s maximum of {arch.max_positions} positions; lower seq_len"
        )
    compute_bytes = 4 if run_precision(cfg.precision, device) == "fp32" else 2  # bf16 and fp16 are both 2 bytes
    return Settings(
        method=cfg.method,
        base_quant=cfgmod.effective_base_quant(cfg),
        compute_bytes=compute_bytes,
        seq_len=cfg.seq_len,
        micro_batch=cfg.micro_batch,
        grad_accum=cfg.grad_accum,
        epochs=cfg.epochs,
        max_steps=cfg.max_steps,
        packing=cfg.packing,
        grad_ckpt=cfg.grad_ckpt,
        targets=archmod.adapter_targets(arch, cfg.lora.targets),
        r=cfg.lora.r,
        lora_dropout=cfg.lora.dropout,
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        seed=cfg.seed,
        compile=cfg.compile,
        attention=cfg.attention,
    )


def dataset_lengths(cfg: cfgmod.TrainConfig, tokenizer_ref: str | None) -> workload.Lengths:
    """Real lengths after the template and truncation, from the same pipeline (and cache) `train` uses."""
    from ..data.pipeline import prepare
    from ..specs import data_spec
    from .. import sources as load

    ref = tokenizer_ref or cfg.model
    try:
        tokenizer = load.load_tokenizer(load.resolve(ref))
    except TunelabError as e:
        raise TunelabError(
            f"{e} (plan needs the tokenizer to measure data.path; pass --tokenizer MODEL to measure with another local one)"
        ) from None
    data = prepare(data_spec(cfg), tokenizer)
    st = data.stats
    proxy = f", tokenized with {ref}'s tokenizer" if tokenizer_ref else ""
    return workload.Lengths(
        st.examples,
        st.mean_len,
        st.tokens_loss / st.examples,
        source=f"dataset {cfg.data.path}: {st.rows} rows, {st.truncated} truncated, {st.dropped} dropped{proxy}",
        lengths=data.lengths,
        truncated=st.truncated,
        dropped=st.dropped,
    )


def local_device(precision: str) -> Device:
    """The present machine: its peak from a calibration record, else a short matmul probe."""
    from ..device import device_memory_bytes, device_name, pick_device, pick_precision
    from ..bench.probe import matmul_peak
    from ..plan.calibration import device_key, load_calibration

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
    gpu = catalog.Gpu(
        "local", name, device_memory_bytes(dev), 0.0, peak, prec.name == "bf16", cls, source=source, peak_source=source
    )
    return Device(gpu, overhead, record)


def local_prediction(cfg: cfgmod.TrainConfig):
    """plan's estimate for a training config on the present device, as `plan --gpu local` computes it: what
    `bench` and the demo put beside their measurements."""
    arch = archmod.resolve_arch(cfg.model)
    device = local_device(cfg.precision)
    return estimate(arch, dataset_lengths(cfg, None), settings_from_config(cfg, arch, device), device)
