"""plan's prediction for a training config: the config's sections as plan's Job, the dataset's real lengths,
the present machine as a plan Device; `tunelab plan`, bench and the demo all use it. Torch is imported only to
probe the local device."""

from __future__ import annotations

from dataclasses import replace

from .. import config as cfgmod
from ..errors import TunelabError
from ..plan import catalog, workload
from ..plan.estimate import Device, Job, estimate
from ..sources import resolve_arch


def _tokenizer(cfg: cfgmod.TrainConfig, tokenizer_ref: str | None):
    from .. import sources

    try:
        return sources.load_tokenizer(sources.resolve(tokenizer_ref or cfg.model, weights=False))
    except TunelabError as e:
        raise TunelabError(
            f"{e} (plan needs the tokenizer to measure data.path; pass --tokenizer MODEL to measure with another local one)"
        ) from None


def dataset_lengths(cfg: cfgmod.TrainConfig, tokenizer_ref: str | None) -> workload.Lengths:
    """Real lengths after the template and truncation, from the same pipeline (and cache) `train` uses; the
    evaluation examples (eval.split or eval.path) split off exactly as `train` splits them."""
    from ..data.pipeline import prepare_split
    from ..specs import data_spec, held_out_spec

    data, held = prepare_split(data_spec(cfg), held_out_spec(cfg), _tokenizer(cfg, tokenizer_ref))
    proxy = f", tokenized with {tokenizer_ref}'s tokenizer" if tokenizer_ref else ""
    source = f"dataset {cfg.data.label}: {data.stats.rows} rows, {data.stats.truncated} truncated, {data.stats.dropped} dropped{proxy}"
    if held is not None:
        where = "held out (eval.split)" if cfg.eval.path is None else f"from {cfg.eval.path}"
        source += f"; evaluation: {held.stats.examples} examples {where}"
    return _lengths(data, source, None if held is None else _lengths(held, "evaluation examples", None))


def _lengths(data, source: str, held_out: workload.Lengths | None) -> workload.Lengths:
    st = data.stats
    return workload.Lengths(
        st.examples,
        st.mean_len,
        st.tokens_loss / st.examples,
        source=source,
        lengths=data.lengths,
        truncated=st.truncated,
        dropped=st.dropped,
        held_out=held_out,
    )


def eval_file_lengths(cfg: cfgmod.TrainConfig, tokenizer_ref: str | None) -> workload.Lengths:
    """eval.path's real lengths, for a plan whose training examples are assumed (no data.path)."""
    from ..data.pipeline import eval_file_spec, prepare
    from ..specs import data_spec

    spec = eval_file_spec(data_spec(cfg), cfg.eval.path, cfg.eval.max_rows)
    return _lengths(prepare(spec, _tokenizer(cfg, tokenizer_ref)), f"evaluation examples from {cfg.eval.path}", None)


def local_device(precision: str, peak_flops: float | None = None, bandwidth_bps: float | None = None) -> Device:
    """The present machine: its peak from a calibration record, else a short matmul probe (or `peak_flops`,
    given, with no probe). A CPU's memory bandwidth likewise: the record's, else a copy probe (or
    `bandwidth_bps`; with `peak_flops` given and no bandwidth, its class's catalog figure, no probe)."""
    from ..device import cpu_class, device_memory_bytes, device_name, pick_device, pick_precision
    from ..plan.calibration import device_key, load_calibration
    from ..probe import copy_bandwidth, matmul_peak

    dev = pick_device("auto")
    prec = pick_precision(precision, dev)
    name = device_name(dev)
    record = load_calibration(device_key(name))
    memory = device_memory_bytes(dev)
    row = catalog.match_gpu(name, memory) if dev.type == "cuda" else None
    if peak_flops is not None:
        peak, source = peak_flops, "a floor for the device type, not measured"
    elif record is not None and record.peak_flops:
        peak, source = record.peak_flops, f"calibration record {record.created}"
    elif row is not None:
        # The fitted step constants are fractions of the datasheet peak (plan/fit.py), as bench's MFU is: a
        # probed peak (790 of 989 TFLOP/s on an H200) put plan 25-31% under the measured rates.
        peak, source = row.peak_flops, f"catalog row {row.id}"
    else:
        peak, n = matmul_peak(prec.compute, dev)
        source = f"measured now: {n}^3 {prec.name} matmul probe"
    bandwidth = bandwidth_bps or 0.0
    if dev.type == "cpu" and not bandwidth and peak_flops is None:
        calibrated = record is not None and record.peak_flops and record.bandwidth_bps
        bandwidth = record.bandwidth_bps if calibrated else copy_bandwidth(dev)
    cls = catalog.local_class(dev.type, prec.name, cpu_class() if dev.type == "cpu" else "")
    overhead = catalog.runtime_overhead("cuda" if dev.type == "cuda" else "cpu")
    if record is not None and record.runtime_overhead_bytes is not None:
        overhead = record.runtime_overhead_bytes
    gpu = catalog.Gpu(
        "local",
        name,
        memory,
        row.bandwidth_gbs if row else bandwidth / 1e9,
        peak,
        prec.name == "bf16",
        cls,
        source=source,
        peak_source=source,
        catalog_id=row.id if row else "",
    )
    return Device(gpu, overhead, record)


def local_prediction(
    cfg: cfgmod.TrainConfig,
    peak_flops: float | None = None,
    calibrated: bool = True,
    bandwidth_bps: float | None = None,
):
    """plan's estimate for a training config on the present device, as `plan --gpu local` computes it: what
    `bench` and the demo put beside their measurements. `peak_flops`, `bandwidth_bps` and `calibrated=False`:
    the step model's own figures at a given peak and bandwidth, which `bench --calibrate` compares its
    measurement with."""
    arch = resolve_arch(cfg.model)
    device = local_device(cfg.compute.precision, peak_flops, bandwidth_bps)
    if not calibrated:
        device = replace(device, calibration=None)
    return estimate(arch, dataset_lengths(cfg, None), Job.of(cfg), device)


# The slowest matmul rate a device of each type is assumed to reach (FLOP/s): an upper bound on a run's eager
# time, below which `compile: auto` can decide without probing the device. cpu: under the slowest probe
# recorded (fp32 on a 2-core EPYC capped at AVX2, 171-195 GFLOP/s, benchmarks/quickstart_epyc-fp32-2c_2026-11-23.md).
FLOOR_PEAK_FLOPS = {"cpu": 1e11, "cuda": 1e13}


def run_compile_choice(cfg: cfgmod.TrainConfig, data) -> dict:
    """How a run resolves `compile` (runtime.compile_choice, through plan's estimate, as `tunelab plan --gpu
    local` does): `data` is the run's tokenized training data. A run too short to pay for compiling even at
    the device type's floor rate decides without the matmul probe."""
    from ..runtime import compile_choice

    if isinstance(cfg.compute.compile, bool):
        return compile_choice(cfg.compute.compile, "", None, 0.0, 1.0)
    from ..device import pick_device

    try:
        arch = resolve_arch(cfg.model)
    except TunelabError:  # plan cannot read this model's architecture: no prediction, so no compile
        return compile_choice(cfg.compute.compile, pick_device(cfg.compute.device).type, None, 0.0, 1.0)
    lengths = _lengths(data, "the run's training data", None)
    floor = local_device(cfg.compute.precision, FLOOR_PEAK_FLOPS.get(pick_device(cfg.compute.device).type, 1e13))
    quick = estimate(arch, lengths, Job.of(cfg), floor)
    if not quick.compile_choice["chosen"]:
        return quick.compile_choice
    device = local_device(cfg.compute.precision)
    return estimate(arch, lengths, Job.of(cfg), device).compile_choice
