"""One prediction: a model, a workload and settings on one device -> steps, tokens, FLOPs, memory, time.

Pure composition of the formula modules; `command.py` builds the typed inputs and renders the result.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .. import methods, objectives
from ..runtime import LOGIT_CHUNK, attention_path, hashed_dropout, slot_products
from . import comm, memory, timing, workload
from .arch import Arch
from .calibration import CalibrationRecord
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
    compile: bool = False
    attention: str = "auto"  # config.ATTENTIONS
    eval_every: int = 0  # optimizer steps between evaluations (config.eval_every); used when lengths hold some out
    objective: str = "sft"  # objectives.REGISTRY: a preference pair is two sequences, DPO adds a reference forward
    precompute_reference: bool = False


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
    objective = objectives.get(s.objective)
    batching = workload.Batching(
        s.seq_len, s.micro_batch, s.grad_accum, s.packing, gpus, s.seed, group=objective.sequences
    )
    w = workload.build(lengths, batching, s.epochs, s.max_steps)
    ckpt = workload.checkpoints(w.optimizer_steps, s.save_steps, s.save_total_limit)
    f = flops_per_token(arch, s.method, s.targets, s.r, w.epoch.widest_row, s.grad_ckpt, s.lora_dropout)
    ref = reference_flops_per_token(arch, objective, w.epoch.widest_row, s.precompute_reference, w.epochs_run)
    f = replace(f, reference=ref)
    setup = memory_setup(s, w, d, sharding, gpus)
    mem = memory.breakdown(arch, setup)
    loss_per_row = w.loss_tokens_per_micro_batch / s.micro_batch
    biggest = memory.max_micro_batch(arch, setup, d.gpu.memory_bytes, loss_per_row)
    local = d.gpu.id == "local"
    eff = timing.efficiency(
        d.gpu.device_class, s.method, s.base_quant, d.calibration, s.compile, s.grad_ckpt, arch.total_params, local
    )
    speed = timing.throughput(w.tokens_padded, f.hardware, d.gpu.peak_flops, eff.value, gpus, scaling)
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
    return Estimate(s, d, gpus, sharding, w, ckpt, f, eff, setup, mem, biggest, speed, over, evals, forward, sent)


@dataclass(frozen=True)
class Suggestion:
    change: str
    time_s: float
    saved_s: float
    peak_memory_bytes: int
    fits: bool


def suggestions(arch: Arch, lengths: workload.Lengths, base: Estimate) -> list[Suggestion]:
    """Single-knob changes, each re-estimated with the same formulas, sorted by time saved. The micro-batch
    appears only for memory, traded against gradient accumulation at equal rows per optimizer step: the time
    model has no micro-batch term (its effect on efficiency is not modeled)."""
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
    longest = int(lengths.lengths.max()) if lengths.lengths is not None else int(lengths.mean_tokens)
    shorter = max(8, -(-longest // 8) * 8)
    if shorter < s.seq_len:
        variants.append(
            (
                f"seq_len {s.seq_len} -> {shorter} (longest example: {longest} tokens, nothing truncated)",
                replace(s, seq_len=shorter),
            )
        )
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


def accumulation_split(micro_batch: int, grad_accum: int, largest: int) -> tuple[int, int] | None:
    """The largest micro-batch ≤ `largest` that divides the rows of one optimizer step (micro_batch ×
    grad_accum), with the accumulation that keeps that many rows: the same optimization, in smaller pieces.
    None when nothing smaller than `micro_batch` fits (largest < 1) or it already fits."""
    rows = micro_batch * grad_accum
    for mb in range(min(largest, micro_batch - 1), 0, -1):
        if rows % mb == 0:
            return mb, rows // mb
    return None
