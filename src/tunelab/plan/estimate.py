"""One prediction: a model, a workload and settings on one device -> steps, tokens, FLOPs, memory, time.

Pure composition of the formula modules; `command.py` builds the typed inputs and renders the result.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .. import methods, objectives
from ..runtime import LOGIT_CHUNK, attention_path, compile_choice, hashed_dropout, slot_products
from . import catalog, comm, fit, memory, steptime, timing, workload
from .arch import Arch
from .calibration import CalibrationRecord, scale_key
from .catalog import Gpu
from .flops import FlopsPerToken, flops_per_token, forward_flops_per_token, reference_flops_per_token


@dataclass(frozen=True)
class Settings:
    method: str
    base_quant: str
    compute_bytes: int
    seq_len: int
    micro_batch: int
    grad_accum: int
    epochs: float
    max_steps: int | None
    packing: bool
    grad_ckpt: bool
    targets: tuple[str, ...]
    r: int
    lora_dropout: float
    save_steps: int
    save_total_limit: int
    seed: int = 42
    compile: bool | str = False  # `auto`: estimate() decides (runtime.compile_choice)
    activation_offload: bool = False  # saved activations in pinned host memory (model/offload.py)
    attention: str = "auto"  # config.ATTENTIONS
    eval_every: int = 0  # optimizer steps between evaluations (config.eval_every); used when lengths hold some out
    stack: str = "tunelab"  # STACKS: tunelab, or the tuned HF Trainer + PEFT recipe it is compared with
    objective: str = "sft"  # objectives.REGISTRY: a preference pair is two sequences, DPO adds a reference forward
    precompute_reference: bool = False


# `hf-peft`: the tuned HF Trainer + PEFT recipe (bench/peers.py `hf-trainer-tuned`): the same rows per step,
# padded to the longest of each length-grouped batch, eager, PEFT's LoRA.
STACKS = ("tunelab", "hf-peft")


@dataclass(frozen=True)
class Device:
    gpu: Gpu
    runtime_overhead: int
    calibration: CalibrationRecord | None = None


@dataclass(frozen=True)
class Estimate:
    settings: Settings
    device: Device
    gpus: int
    sharding: str
    work: workload.Workload
    checkpoints: workload.Checkpoints
    flops: FlopsPerToken
    efficiency: timing.Efficiency
    memory_setup: memory.MemorySetup
    memory: memory.MemoryBreakdown
    max_micro_batch: int
    speed: timing.Throughput
    overheads: timing.Overheads
    evaluations: workload.Evaluations | None = None
    forward_flops: float = 0.0  # per held-out token fed (flops.forward_flops_per_token); 0 without evaluation
    comm_bytes: float = 0.0  # sent per GPU per optimizer step (plan/comm.py); 0 on one GPU
    compile_choice: dict | None = None  # runtime.compile_choice: {"mode", "chosen", "why"}
    max_seq_len: int = 0  # the longest packed row that fits the device at this micro-batch (memory.max_seq_len)
    step: steptime.Breakdown | None = None  # one optimizer step's seconds by part, on one GPU
    constants: catalog.StepConstants | None = None  # the step model's constants and where they come from
    model_step_s: float = 0.0  # the step model's own step, before a calibration record scales it

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.device.gpu.memory_bytes

    @property
    def time_s(self) -> float:
        return self.speed.train_s + self.overheads.total


def memory_setup(s: Settings, w: workload.Workload, d: Device, sharding: str, gpus: int) -> memory.MemorySetup:
    device_type = d.gpu.device_type
    # flash-attn's varlen kernels keep what flex keeps (q, k, v, output, log-sum-exp), so whether the target
    # has them installed does not change the memory.
    path = attention_path(s.attention, device_type)
    slots = w.epoch.slots if path == "slots" else 0
    probs = slots > 0 and slot_products(device_type, w.epoch.slot_len, dropout=0.0)
    return memory.MemorySetup(
        method=s.method,
        base_quant=s.base_quant,
        compute_bytes=s.compute_bytes,
        micro_batch=s.micro_batch,
        row_len=w.epoch.widest_row,
        loss_rows=max(1, round(w.loss_tokens_per_micro_batch)),
        loss_chunk=LOGIT_CHUNK,
        grad_ckpt=s.grad_ckpt,
        targets=s.targets,
        r=s.r,
        lora_dropout=s.lora_dropout,
        runtime_overhead=d.runtime_overhead,
        sharding=sharding,
        world=gpus,
        compiled=s.compile,
        slots=slots,
        slot_len=w.epoch.slot_len if slots else 0,
        attention_probs=probs,
        attention=path,
        dropout_mask_kept=not hashed_dropout(device_type, s.compile),
        offload=s.activation_offload and device_type == "cuda",  # on a CPU activations are in host memory anyway
        reference_copy=objectives.get(s.objective).reference
        and methods.get(s.method).trains_base
        and not s.precompute_reference,
        reference_forward=objectives.get(s.objective).reference and not s.precompute_reference,
    )


def estimate(
    arch: Arch,
    lengths: workload.Lengths,
    s: Settings,
    d: Device,
    gpus: int = 1,
    sharding: str = "single",
    scaling: float = 1.0,
) -> Estimate:
    """One prediction. `compile: auto` is resolved here, as the run resolves it (runtime.compile_choice): from
    this same estimate with eager blocks, its training time against the catalog's compile cost and speedup."""
    if not isinstance(s.compile, bool):
        eager = estimate(arch, lengths, replace(s, compile=False), d, gpus, sharding, scaling)
        kind = d.gpu.device_type
        choice = compile_choice(
            s.compile, kind, eager.speed.train_s, catalog.compile_seconds(kind), catalog.compile_speedup(kind)
        )
        resolved = (
            eager
            if not choice["chosen"]
            else estimate(arch, lengths, replace(s, compile=True), d, gpus, sharding, scaling)
        )
        return replace(resolved, settings=replace(resolved.settings, compile=s.compile), compile_choice=choice)
    if s.stack == "hf-peft":
        s = replace(s, packing=False, compile=False)
    objective = objectives.get(s.objective)
    batching = workload.Batching(
        s.seq_len, s.micro_batch, s.grad_accum, s.packing, gpus, s.seed, group=objective.sequences
    )
    w = workload.build(lengths, batching, s.epochs, s.max_steps)
    ckpt = workload.checkpoints(w.optimizer_steps, s.save_steps, s.save_total_limit)
    doc_keys = steptime.attention_keys(lengths.lengths, lengths.mean_tokens, s.seq_len, True)
    f = flops_per_token(arch, s.method, s.targets, s.r, w.epoch.widest_row, s.grad_ckpt, s.lora_dropout, doc_keys)
    ref = reference_flops_per_token(arch, objective, w.epoch.widest_row, s.precompute_reference, w.epochs_run)
    f = replace(f, reference=ref)
    setup = memory_setup(s, w, d, sharding, gpus)
    mem = memory.breakdown(arch, setup)
    loss_per_row = w.loss_tokens_per_micro_batch / s.micro_batch
    biggest = memory.max_micro_batch(arch, setup, d.gpu.memory_bytes, loss_per_row)
    longest = memory.max_seq_len(arch, setup, d.gpu.memory_bytes, loss_per_row / max(1, w.epoch.widest_row))
    step, constants, eff, model_step_s = step_time(arch, lengths, s, d, w)
    if f.reference:  # DPO's reference forward: its FLOPs at the rate the step's own work runs
        step = step.scaled(f.hardware / (f.hardware - f.reference))
    tokens_per_step = w.epoch.tokens_padded / w.epoch.micro_batches * s.grad_accum
    speed = timing.step_throughput(w.tokens_padded, tokens_per_step, step.total, gpus, scaling)
    trainable = memory.trainable_params(arch, setup)
    periodic, final = timing.checkpoint_bytes(trainable, arch.total_params, s.method)
    on_disk = arch.total_params * 2  # 16-bit safetensors, quantized at load time for int8/nf4
    evals, forward, eval_s = None, 0.0, 0.0
    if lengths.held_out is not None:
        evals = workload.evaluations(lengths.held_out, batching, w.optimizer_steps, s.eval_every)
        forward = forward_flops_per_token(arch, s.method, s.targets, s.r, evals.widest_row)
        eval_s = timing.evaluation_seconds(evals.count * evals.tokens_padded, forward, d.gpu.peak_flops, eff.value)
    over = timing.overheads(on_disk, ckpt.written, periodic, final, s.compile, d.gpu.device_type, eval_s)
    sent = comm.step_bytes(arch, setup, s.grad_accum)
    choice = compile_choice(s.compile, d.gpu.device_type, None, 0.0, 1.0)
    return Estimate(
        s,
        d,
        gpus,
        sharding,
        w,
        ckpt,
        f,
        eff,
        setup,
        mem,
        biggest,
        speed,
        over,
        evals,
        forward,
        sent,
        choice,
        longest,
        step,
        constants,
        model_step_s,
    )


def attention_work(w: workload.Workload, attention: str, device_type: str) -> tuple[float, float]:
    """(keys per fed token the attention kernel computes, those of them whose scores it writes out) for the
    `attention` setting on `device_type`. Packed rows on the slot path (a CPU's): the slots' squares and the
    masked rows' (workload.EpochCounts.slot_pairs, masked_pairs), the slots' scores written where they run as
    explicit products; packed rows elsewhere: each document's causal keys (a GPU's FlexAttention and flash
    kernels skip the rest); padded rows: their whole width."""
    if not w.batching.packing:
        return steptime.attention_keys(None, 0, round(w.epoch.tokens_padded / w.epoch.rows), False), 0.0
    e = w.epoch
    if attention_path(attention, device_type) == "slots" and (e.slot_pairs or e.masked_pairs):
        products = slot_products(device_type, 0, dropout=0.0)  # whether this device runs short slots as products
        return (e.slot_pairs + e.masked_pairs) / e.tokens_padded, e.scored_pairs / e.tokens_padded if products else 0.0
    lengths = w.lengths
    return steptime.attention_keys(lengths.lengths, lengths.mean_tokens, w.batching.seq_len, True), 0.0


def step_time(
    arch: Arch, lengths: workload.Lengths, s: Settings, d: Device, w: workload.Workload
) -> tuple[steptime.Breakdown, catalog.StepConstants, timing.Efficiency, float]:
    """One optimizer step's seconds by part (plan/steptime.py) on one GPU, the constants used, the achieved
    fraction of the peak it implies, and the step model's own seconds. A calibration record of the device for
    the method scales the parts: by its measured/modeled step ratio (`step_scale`, so the model's dependence
    on micro-batch, seq_len and the data carries over from the calibrated run), or, in older records, to the
    calibrated flat efficiency."""
    gpu = d.gpu
    device = gpu.catalog_id or (gpu.device_class if gpu.id == "local" else gpu.id)
    constants = catalog.step_constants(device, gpu.device_type)
    bandwidth = gpu.bandwidth_gbs * 1e9 or constants.bandwidth_gbs * 1e9 or catalog.nearest_bandwidth(gpu.peak_flops)
    tokens = w.epoch.tokens_padded / w.epoch.micro_batches
    keys, scored = attention_work(w, s.attention, gpu.device_type)
    shape = steptime.Shape(
        s.grad_accum,
        round(tokens),
        keys,
        s.compile,
        s.compute_bytes,
        w.loss_tokens_per_micro_batch,
        scored_keys_per_token=scored,
    )
    ridge = fit.ridge(gpu.device_type if gpu.device_type == "cpu" else "cuda", gpu.peak_flops, bandwidth)
    work = steptime.work(arch, s.method, s.base_quant, s.targets, s.r, s.grad_ckpt, shape, ridge)
    c = steptime.Constants(constants.matmul, constants.attention, constants.bandwidth, constants.launch_s)
    step = steptime.breakdown(work, gpu.peak_flops, bandwidth, c)
    scale, peer_rows = catalog.stack_scale(s.stack)
    step = step.scaled(scale)
    f = flops_per_token(arch, s.method, s.targets, s.r, w.epoch.widest_row, s.grad_ckpt, s.lora_dropout, keys)
    key = timing.method_key(s.method, s.base_quant)
    modeled = step.total
    record = d.calibration if s.stack == "tunelab" else None
    found = calibration_scale(record, key, bool(s.compile)) if record is not None else None
    if found is not None:
        scale, measured_as = found
        step = step.scaled(scale)
        value = tokens * s.grad_accum * f.hardware / (gpu.peak_flops * step.total)
        label = (
            f"calibrated for {key} on {record.device_name}, {record.created}: step model x {scale:.3f}"
            f" (measured {measured_as})"
        )
        return step, constants, timing.Efficiency(value, label), modeled
    if record is not None and key in record.efficiency:
        value = record.efficiency[key]
        calibrated = tokens * s.grad_accum * f.hardware / (gpu.peak_flops * value)
        step = step.scaled(calibrated / step.total)
        label = f"calibrated for {key} on {record.device_name}, {record.created}: efficiency {value:.2f}"
        return step, constants, timing.Efficiency(value, label), modeled
    value = tokens * s.grad_accum * f.hardware / (gpu.peak_flops * step.total)
    whose = f"class {device}" if gpu.id == "local" and not gpu.catalog_id else device
    # The headline is the useful MFU (attention over the documents' causal keys): the whole-row fraction above
    # counts attention a packed row never computes and passes 1 on long rows of short documents.
    useful = tokens * s.grad_accum * f.useful / (gpu.peak_flops * step.total)
    label = f"step model, useful MFU {useful:.0%}; constants for {whose}: {constants.label}"
    if s.stack != "tunelab":
        label += f"; stack {s.stack} x {scale:.2f} from {len(peer_rows)} measured peer rows"
    if gpu.id == "local" and not constants.measured:
        label += "; `tunelab bench --calibrate` measures this device"
    return step, constants, timing.Efficiency(value, label), modeled


@dataclass(frozen=True)
class Suggestion:
    change: str
    time_s: float
    saved_s: float
    peak_memory_bytes: int
    fits: bool


def suggestions(arch: Arch, lengths: workload.Lengths, base: Estimate) -> list[Suggestion]:
    """Single-knob changes, each re-estimated with the same formulas, sorted by time saved. The micro-batch
    appears only for memory, traded against gradient accumulation at equal rows per optimizer step (the step
    model prices it: smaller micro-batches launch more kernels per token)."""
    s = base.settings
    variants: list[tuple[str, Settings]] = []
    split = accumulation_split(s.micro_batch, s.grad_accum, base.max_micro_batch) if not base.fits else None
    if split is not None:
        mb, accum = split
        variants.append(
            (
                f"micro-batch {s.micro_batch} -> {mb}, grad_accum {s.grad_accum} -> {accum} (same rows per "
                "optimizer step), for memory",
                replace(s, micro_batch=mb, grad_accum=accum),
            )
        )
    if not s.packing:
        variants.append(("packing on", replace(s, packing=True)))
    if s.grad_ckpt:
        variants.append(("gradient checkpointing off", replace(s, grad_ckpt=False)))
    shorter, why = shortest_seq_len(lengths, s.objective)
    if shorter < s.seq_len:
        variants.append((f"seq_len {s.seq_len} -> {shorter} ({why})", replace(s, seq_len=shorter)))
    if not base.fits and methods.get(s.method).quantized is not None and s.base_quant == "none":
        quantized = methods.get(methods.get(s.method).quantized)
        variants.append(
            ("QLoRA (nf4 base) for memory", replace(s, method=quantized.name, base_quant=quantized.base_quant))
        )
    if not base.fits and not s.grad_ckpt:
        variants.append(("gradient checkpointing on, for memory", replace(s, grad_ckpt=True)))
    out = []
    for label, v in variants:
        e = estimate(arch, lengths, v, base.device, base.gpus, base.sharding)
        # A speed change that saves under 1% is noise in this model; memory changes are always shown.
        if "for memory" in label or base.time_s - e.time_s > 0.01 * base.time_s:
            out.append(Suggestion(label, e.time_s, base.time_s - e.time_s, e.memory.total, e.fits))
    return sorted(out, key=lambda x: -x.saved_s)


def calibration_scale(record: CalibrationRecord, key: str, compiled: bool) -> tuple[float, str] | None:
    """The record's step scale for method `key` (measured eager and compiled apart, as the step model's error
    differs between them), and how it was measured: the run's own mode first, else the other mode's, said so."""
    mine = "compiled" if compiled else "eager"
    for as_compiled in (compiled, not compiled):
        scale = record.step_scale.get(scale_key(key, as_compiled))
        if scale is not None:
            mode = "compiled" if as_compiled else "eager"
            return scale, mode if mode == mine else f"{mode}, applied to a{'' if compiled else 'n'} {mine} run"
    return None


def shortest_seq_len(lengths: workload.Lengths, objective: str) -> tuple[int, str]:
    """The shortest seq_len (a multiple of 8) that truncates nothing, and why. Each side of a preference pair is
    cut to seq_len // 2 (data/preference.py), so there the row must hold twice the longest side."""
    longest = int(lengths.lengths.max()) if lengths.lengths is not None else int(lengths.mean_tokens)
    sides = objectives.get(objective).sequences
    what = "example" if sides == 1 else "side of a pair"
    return max(8, -(-longest * sides // 8) * 8), f"longest {what}: {longest} tokens, nothing truncated"


def accumulation_split(micro_batch: int, grad_accum: int, largest: int) -> tuple[int, int] | None:
    """The largest micro-batch ≤ `largest` that divides the rows of one optimizer step (micro_batch ×
    grad_accum), with the accumulation that keeps that many rows: the same optimization, in smaller pieces.
    None when nothing smaller than `micro_batch` fits (largest < 1) or it already fits."""
    rows = micro_batch * grad_accum
    for mb in range(min(largest, micro_batch - 1), 0, -1):
        if rows % mb == 0:
            return mb, rows // mb
    return None
