"""One prediction: a model, a workload and a job (the config's sections) on one device -> steps, tokens, FLOPs,
memory, time.

Pure composition of the formula modules; `commands/plan.py` and `recipes/predict.py` build the inputs and
`render.py` prints the result.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from .. import methods, optimizers
from ..errors import TunelabError
from ..runtime import CompileChoice, attention_path, compile_choice, hashed_dropout, slot_max_len, slot_products
from . import catalog, comm, fit, hfstack, memory, steptime, timing, workload
from .arch import Arch, adapter_targets
from .calibration import CalibrationRecord, scale_key
from .catalog import Gpu
from .flops import FlopsPerToken, flops_per_token, forward_flops_per_token, reference_flops_per_token
from .job import STACKS, Job

__all__ = ["STACKS", "Device", "Estimate", "Job", "estimate", "suggestions"]


@dataclass(frozen=True)
class Device:
    gpu: Gpu
    runtime_overhead: int
    calibration: CalibrationRecord | None = None
    # A local CPU's product-call probe (probe.product_call_s, seconds); 0: its class's catalog figure (calls.yaml)
    call_s: float = 0.0


def constants_key(device: Device) -> str:
    """The key a device's fitted constants are filed under (catalog/fitted.yaml, catalog/grpo.yaml): its catalog
    id, or a local machine's class."""
    gpu = device.gpu
    return gpu.catalog_id or (gpu.device_class if gpu.id == "local" else gpu.id)


@dataclass(frozen=True, kw_only=True)
class Estimate:
    job: Job
    device: Device
    gpus: int
    sharding: str
    work: workload.Workload
    checkpoints: workload.Checkpoints
    flops: FlopsPerToken
    efficiency: timing.Efficiency
    layout: memory.Layout
    memory: memory.MemoryBreakdown
    max_micro_batch: int
    speed: timing.Throughput
    overheads: timing.Overheads
    evaluations: workload.Evaluations | None = None
    forward_flops: float = 0.0  # per held-out token fed (flops.forward_flops_per_token); 0 without evaluation
    comm_bytes: float = 0.0  # sent per GPU per optimizer step (plan/comm.py); 0 on one GPU
    compile_choice: CompileChoice | None = None  # how `compile` resolved for this run, and why
    max_seq_len: int = 0  # the longest packed row that fits the device at this micro-batch (memory.max_seq_len)
    step: steptime.Breakdown | None = None  # one optimizer step's seconds by part, on one GPU
    constants: catalog.StepConstants | None = None  # the step model's constants and where they come from
    model_step_s: float = 0.0  # the step model's own step, before a calibration record scales it
    compiled: bool = False  # whether the predicted run compiles its blocks (`compile: auto` as resolved, per stack)
    # The schedule's optimizer steps where `max_minutes` ends the run before them (then `work` is the steps that
    # run); 0 when it does not.
    time_limited_from: int = 0
    varied_reserve: float = 0.0  # memory.varied_reserve_bytes: the allocator's reserve from rows of varied width

    @property
    def figures(self) -> memory.Figures:
        """The peak as allocated, reserved and process memory (memory.stated_figures); `memory.total` is the
        process's."""
        overhead = self.memory.runtime_overhead
        context = memory.CUDA_CONTEXT_BYTES if self.device.gpu.device_type == "cuda" else 0
        return memory.stated_figures(self.memory.total - overhead, overhead, context, self.varied_reserve)

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.device.gpu.memory_bytes

    @property
    def time_s(self) -> float:
        return self.speed.train_s + self.overheads.total


def run_precision(precision: str, device: Device) -> str:
    """The precision a run picks on `device`: `auto` is bf16 where the device has it (a local CPU without bf16
    units computes in fp32, device.pick_precision), else fp16."""
    if precision != "auto":
        return precision
    if device.gpu.device_type == "cpu":
        return "bf16" if device.gpu.bf16 else "fp32"
    return "bf16" if device.gpu.bf16 else "fp16"


def compute_bytes(job: Job, d: Device) -> int:
    """Bytes of an activation: bf16 and fp16 are both 2; full fine-tuning with bf16 weights casts the model to bf16
    (model/adapters.apply_adapter), so every product's output is bf16 even where the run's precision is fp32."""
    if job.method.trains_base and job.weight_bytes == 2:
        return 2
    return 4 if run_precision(job.compute.precision, d) == "fp32" else 2


def head_rows(job: Job, w: workload.Workload) -> float:
    """Positions per micro-batch the head and the loss run over (Job.head_positions)."""
    return job.head_positions(w.epoch.tokens_padded / w.epoch.micro_batches, w.loss_tokens_per_micro_batch)


def pages_returned_before_step(job: Job, device_type: str) -> int:
    """The freed pages a run returns before each optimizer step, as recipes/finetune.py does: a full fine-tune on a
    CPU whose step allocates scratch (optimizers.Optimizer.returns_pages_before_step), the catalog's figure."""
    returns = job.method.trains_base and job.optim.returns_pages_before_step(job.optimizer.optimizer_in_backward)
    return catalog.freed_pages_held(device_type) if device_type == "cpu" and returns else 0


def layout(arch: Arch, job: Job, w: workload.Workload, d: Device, sharding: str, gpus: int) -> memory.Layout:
    """What plan derives for memory from the job, the workload's micro-batches and the device."""
    device_type = d.gpu.device_type
    # flash-attn's varlen kernels keep what flex keeps (q, k, v, output, log-sum-exp), so whether the target
    # has them installed does not change the memory.
    path = attention_path(job.compute.attention, device_type)
    slots = w.epoch.slots if path == "slots" else 0
    half = compute_bytes(job, d) == 2
    probs = slots > 0 and slot_products(device_type, w.epoch.slot_len, 0.0, job.compiled, half)
    reference = job.goal.reference and not job.objective.preference.precompute_reference
    # Whole rows on the CPU's slot path run SDPA under a mask (memory.Layout.row_mask), measured eager; a
    # generating objective's update runs its rows as causal slots of its own (attention.rows_attention).
    masked = path == "slots" and device_type == "cpu" and not job.compiled and not job.goal.generates
    mask_rows = (job.batch.micro_batch if job.batch.packing else 1) if masked and job.hf is None else 0
    lay = memory.Layout(
        compute_bytes=compute_bytes(job, d),
        targets=adapter_targets(arch, job.adapter.lora.targets),
        row_len=w.epoch.widest_row,
        loss_rows=max(1, round(head_rows(job, w))),
        runtime_overhead=d.runtime_overhead,
        pages_returned_before_step=pages_returned_before_step(job, device_type),
        sharding=sharding,
        world=gpus,
        slots=slots,
        slot_len=w.epoch.slot_len if slots else 0,
        attention_probs=probs,
        attention=path,
        row_mask=0 if slots else mask_rows,
        dropout_mask_kept=not hashed_dropout(device_type, job.compute.compile),
        offload_capable=device_type == "cuda",
        offload=job.compute.activation_offload
        and device_type == "cuda",  # on a CPU activations are in host memory anyway
        # GRPO's KL term (beta > 0) scores under the reference before the update, so its forward is not the step's,
        # but under full fine-tuning its frozen copy is held the whole run (methods.Method.reference).
        reference_copy=(reference or job.objective.uses_reference and not job.goal.reference)
        and job.method.trains_base,
        reference_forward=reference,
        chunked_head_copies=device_type == "cpu",
    )
    if slots and w.epoch.masked_pairs:
        # Some micro-batches run over whole rows under a mask instead: the peak is at whichever saves more (slots
        # of few short sequences save less than whole rows).
        rows = replace(lay, slots=0, slot_len=0, attention_probs=False, row_mask=mask_rows)
        return max(lay, rows, key=lambda s: memory.activation_bytes(arch, job, s))
    return lay


def estimate(
    arch: Arch,
    lengths: workload.Lengths,
    job: Job,
    d: Device,
    gpus: int = 1,
    sharding: str = "single",
    scaling: float = 1.0,
) -> Estimate:
    """One prediction. `compile: auto` is resolved here, as the run resolves it (runtime.compile_choice): from
    this same estimate with eager blocks, its training time against the catalog's compile cost and speedup."""
    if job.batch.seq_len > arch.max_positions > 0:
        raise TunelabError(
            f"seq_len {job.batch.seq_len} is over {arch.name}'s maximum of {arch.max_positions} positions; lower seq_len"
        )
    if job.adapter.lora.router and arch.moe is None:
        raise TunelabError(f"lora.router: {arch.name} has no router (not a Mixture-of-Experts model); drop lora.router")
    if job.moe.imbalance != 1 and arch.moe is None:
        raise TunelabError(
            f"moe.imbalance={job.moe.imbalance:g} applies to Mixture-of-Experts models; {arch.name} is dense, so "
            "no expert is loaded more than another; drop it"
        )
    job = stack_job(job)  # an HF script runs eager blocks: no `compile: auto` to resolve
    if not isinstance(job.compute.compile, bool):
        eager = estimate(arch, lengths, job.but(compile=False), d, gpus, sharding, scaling)
        kind = d.gpu.device_type
        choice = compile_choice(
            job.compute.compile, kind, eager.speed.train_s, catalog.compile_seconds(kind), catalog.compile_speedup(kind)
        )
        resolved = (
            eager if not choice.chosen else estimate(arch, lengths, job.but(compile=True), d, gpus, sharding, scaling)
        )
        return replace(resolved, job=replace(resolved.job, compute=job.compute), compile_choice=choice)
    b = job.batch
    products_len = slot_max_len(job.compiled, compute_bytes(job, d) == 2)
    batching = workload.Batching(b, gpus, job.run.seed, group=job.goal.sequences, products_len=products_len)
    w, feed = hf_fed(job, workload.build(lengths, batching, b.epochs, b.max_steps))
    ckpt = workload.checkpoints(w.optimizer_steps, job.run.save_steps, job.run.save_total_limit)
    lay = layout(arch, job, w, d, sharding, gpus)
    f = job_flops(arch, job, lay, w, steptime.attention_keys(lengths.lengths, lengths.mean_tokens, b.seq_len, True))
    mem = memory.breakdown(arch, job, lay)
    loss_per_row = head_rows(job, w) / b.micro_batch
    biggest = memory.max_micro_batch(arch, job, lay, d.gpu.memory_bytes, loss_per_row)
    longest = memory.max_seq_len(arch, job, lay, d.gpu.memory_bytes, loss_per_row / max(1, w.epoch.widest_row))
    step, constants, eff, model_step_s = step_time(arch, lengths, job, lay, d, w, feed)
    if f.reference:  # DPO's reference forward: its FLOPs at the rate the step's own work runs
        step = step.scaled(f.hardware / (f.hardware - f.reference))
    tokens_per_step = w.epoch.tokens_padded / w.epoch.micro_batches * b.grad_accum
    speed = timing.step_throughput(w.tokens_padded, tokens_per_step, step.total, gpus, scaling)
    periodic, final = timing.checkpoint_bytes(memory.trainable_params(arch, job, lay), arch.total_params, job.method)
    on_disk = arch.total_params * 2  # 16-bit safetensors, quantized at load time for int8/nf4
    evals, forward, eval_s = None, 0.0, 0.0
    if lengths.held_out is not None:
        evals = workload.evaluations(lengths.held_out, batching, w.optimizer_steps, job.eval_every)
        forward = forward_flops_per_token(arch, job.adapter.method, lay.targets, job.adapter.lora.r, evals.widest_row)
        eval_s = timing.evaluation_seconds(evals.count * evals.tokens_padded, forward, d.gpu.peak_flops, eff.value)
    fixed = timing.overheads(on_disk, ckpt.written, periodic, final, job.compiled, d.gpu.device_type, eval_s)
    runs = timing.steps_within(
        job.run.max_minutes * 60, w.optimizer_steps, speed.train_s + fixed.compile_s, fixed.compile_s
    )
    if runs < w.optimizer_steps:  # the same job stopped by its time limit: the steps that run, nothing after
        limited = estimate(arch, lengths, job.but(max_steps=runs, max_minutes=0.0), d, gpus, sharding, scaling)
        return replace(limited, job=job, time_limited_from=w.optimizer_steps)
    return Estimate(
        job=job,
        device=d,
        gpus=gpus,
        sharding=sharding,
        work=w,
        checkpoints=ckpt,
        flops=f,
        efficiency=eff,
        layout=lay,
        memory=mem,
        max_micro_batch=biggest,
        speed=speed,
        overheads=fixed,
        evaluations=evals,
        forward_flops=forward,
        comm_bytes=comm.step_bytes(arch, job, lay, b.grad_accum),
        compile_choice=compile_choice(job.compute.compile, d.gpu.device_type, None, 0.0, 1.0),
        max_seq_len=longest,
        step=step,
        constants=constants,
        model_step_s=model_step_s,
        compiled=job.compiled,
        varied_reserve=memory.varied_reserve_bytes(arch, job, lay, w.epoch.tokens_padded / max(1, w.epoch.rows))
        if d.gpu.device_type == "cuda"
        else 0.0,
    )


def stack_job(job: Job) -> Job:
    """The job as its stack runs it: an HF Trainer + PEFT script (Stack.hf) feeds unpacked examples (its padding
    is the spec's), runs eager blocks and keeps its `optim`'s states (optimizers.py's row)."""
    if not job.stack_row.hf:
        return job
    spec = job.hf or hfstack.HfStack()
    return job.but(packing=False, compile=False, optimizer=spec.optimizer, hf=spec)


def hf_fed(job: Job, w: workload.Workload) -> tuple[workload.Workload, hfstack.Fed | None]:
    """`w` with what the HF stack feeds (hfstack.fed: its padding) and its attention work; unchanged for tunelab."""
    if job.hf is None:
        return w, None
    lengths = w.lengths.lengths
    if lengths is None:
        lengths = hfstack.assumed_lengths(w.lengths.examples, w.lengths.mean_tokens)
    b = job.batch
    feed = hfstack.fed(job.hf, lengths, b.micro_batch, b.seq_len, job.run.seed)
    epoch = replace(
        w.epoch,
        tokens_padded=feed.tokens_padded,
        widest_row=feed.widest_row,
        micro_batches=feed.micro_batches,
        rows=feed.rows,
    )
    return workload.from_epoch(w.lengths, w.batching, epoch, b.epochs, b.max_steps), feed


def job_flops(arch: Arch, job: Job, lay: memory.Layout, w: workload.Workload, keys: float) -> FlopsPerToken:
    """FLOPs per fed token of the job's step at `keys` attention keys per token, the reference forward's included."""
    lora = job.adapter.lora
    f = flops_per_token(
        arch, job.adapter.method, lay.targets, lora.r, w.epoch.widest_row, job.compute.grad_ckpt, lora.dropout, keys
    )
    ref = reference_flops_per_token(
        arch, job.goal, w.epoch.widest_row, job.objective.preference.precompute_reference, w.epochs_run
    )
    return replace(f, reference=ref)


def attention_work(w: workload.Workload, attention: str, device_type: str) -> tuple[float, float]:
    """(keys per fed token the attention kernel computes, those of them whose scores it writes out) for the
    `attention` setting on `device_type`. Packed rows on the slot path (a CPU's): the slots' squares and the
    masked rows' (workload.EpochCounts.slot_pairs, masked_pairs), the slots' scores written where they run as
    explicit products; packed rows elsewhere: each document's causal keys (a GPU's FlexAttention and flash
    kernels skip the rest); padded rows: their whole width."""
    if not w.batching.batch.packing:
        return steptime.attention_keys(None, 0, round(w.epoch.tokens_padded / w.epoch.rows), False), 0.0
    e = w.epoch
    if attention_path(attention, device_type) == "slots" and (e.slot_pairs or e.masked_pairs):
        products = slot_products(device_type, 0, 0.0, False, False)  # whether this device runs short slots as products
        return (e.slot_pairs + e.masked_pairs) / e.tokens_padded, e.scored_pairs / e.tokens_padded if products else 0.0
    lengths = w.lengths
    return steptime.attention_keys(lengths.lengths, lengths.mean_tokens, w.batching.batch.seq_len, True), 0.0


def step_shape(
    job: Job, w: workload.Workload, keys: float, scored: float, compute_bytes: int, cpu: bool = False
) -> steptime.Shape:
    """What the step model prices for `job`: its mean micro-batch in `w`, `keys` attention keys per token (`scored`
    of them written out), in `compute_bytes` a value, on a CPU (`cpu`: an MoE model's experts one product per
    expert) or not; plan's estimate and the fit of measured rows share it."""
    tokens = w.epoch.tokens_padded / w.epoch.micro_batches
    hf = job.hf
    return steptime.Shape(
        job.batch.grad_accum,
        round(tokens),
        keys,
        job.compiled,
        compute_bytes,
        head_rows(job, w),
        scored_keys_per_token=scored,
        whole_logits=job.whole_vocab_logits,
        fused_ops=hf is not None and hf.use_liger_kernel,
        eager_attention=hf is not None and hf.eager_attention,
        fused_optimizer=hf is None or hf.fused_optimizer,
        imbalance=job.moe.imbalance,
        # tunelab's CPU experts path (model/moe.Segments: one oneDNN product per expert, LoRA over tiles), what the
        # product-call probe measures; the HF stack's experts (torch's _grouped_mm on a CPU, PEFT's
        # parametrization) keep the grouped pricing
        expert_segments=cpu and hf is None,
    )


def step_time(
    arch: Arch,
    lengths: workload.Lengths,
    job: Job,
    lay: memory.Layout,
    d: Device,
    w: workload.Workload,
    feed: hfstack.Fed | None = None,
) -> tuple[steptime.Breakdown, catalog.StepConstants, timing.Efficiency, float]:
    """One optimizer step's seconds by part (plan/steptime.py) on one GPU, the constants used, the achieved
    fraction of the peak it implies, and the step model's own seconds. A calibration record of the device for
    the method scales the parts: by its measured/modeled step ratio (`step_scale`, so the model's dependence
    on micro-batch, seq_len and the data carries over from the calibrated run), or, in older records, to the
    calibrated flat efficiency."""
    gpu = d.gpu
    constants = catalog.step_constants(constants_key(d), gpu.device_type)
    bandwidth = gpu.bandwidth_gbs * 1e9 or constants.bandwidth_gbs * 1e9 or catalog.nearest_bandwidth(gpu.peak_flops)
    tokens = w.epoch.tokens_padded / w.epoch.micro_batches
    if feed is not None:
        keys, scored = feed.keys_per_token, feed.scored_keys_per_token
    else:
        keys, scored = attention_work(w, job.compute.attention, gpu.device_type)
    accum = job.batch.grad_accum
    cpu = gpu.device_type == "cpu"
    shape = step_shape(job, w, keys, scored, lay.compute_bytes, cpu)
    ridge = fit.ridge(gpu.device_type if gpu.device_type == "cpu" else "cuda", gpu.peak_flops, bandwidth)
    work = steptime.work(
        arch, job.method, job.adapter.quant, lay.targets, job.adapter.lora.r, job.compute.grad_ckpt, shape, ridge
    )
    c = steptime.Constants(constants.matmul, constants.attention, constants.bandwidth, constants.launch_s)
    call_s = d.call_s or catalog.product_call_s(constants_key(d), gpu.device_type)[0]
    step = steptime.breakdown(work, gpu.peak_flops, bandwidth, c, call_s)
    per_pair, peer_rows = catalog.stack_pair_bytes(job.stack, "cpu" if gpu.device_type == "cpu" else "cuda")
    if job.hf is not None and job.hf.masked_kernel:  # attention with a padding mask: the fitted bytes per head-pair
        pairs = steptime.masked_head_pairs(arch, shape.tokens, keys, job.compute.grad_ckpt) * accum
        step = replace(step, attention_s=step.attention_s + pairs * per_pair / (bandwidth * c.bandwidth))
    lora = job.adapter.lora
    f = flops_per_token(
        arch, job.adapter.method, lay.targets, lora.r, w.epoch.widest_row, job.compute.grad_ckpt, lora.dropout, keys
    )
    key = job.method.key(job.adapter.quant)
    modeled = step.total
    record = d.calibration if job.hf is None else None  # a calibration record measures tunelab's own step
    found = calibration_scale(record, key, job.compiled) if record is not None else None
    if found is not None:
        scale, measured_as = found
        step = step.scaled(scale)
        value = tokens * accum * f.hardware / (gpu.peak_flops * step.total)
        label = (
            f"calibrated for {key} on {record.device_name}, {record.created}: step model x {scale:.3f}"
            f" (measured {measured_as})"
        )
        return step, constants, timing.Efficiency(value, label), modeled
    if record is not None and key in record.efficiency:
        value = record.efficiency[key]
        calibrated = tokens * accum * f.hardware / (gpu.peak_flops * value)
        step = step.scaled(calibrated / step.total)
        label = f"calibrated for {key} on {record.device_name}, {record.created}: efficiency {value:.2f}"
        return step, constants, timing.Efficiency(value, label), modeled
    value = tokens * accum * f.hardware / (gpu.peak_flops * step.total)
    whose = f"class {constants_key(d)}" if gpu.id == "local" and not gpu.catalog_id else constants_key(d)
    # The headline is the useful MFU (attention over the documents' causal keys): the whole-row fraction above
    # counts attention a packed row never computes and passes 1 on long rows of short documents.
    useful = tokens * accum * f.useful / (gpu.peak_flops * step.total)
    label = f"step model, useful MFU {useful:.0%}; constants for {whose}: {constants.label}"
    if job.hf is not None:
        label += f"; stack {job.stack} ({job.hf.label(job.adapter.quant != 'none')})"
        if job.hf.masked_kernel:
            label += f", masked attention {per_pair:.0f} B a head-pair from {len(peer_rows)} measured HF rows"
    if gpu.id == "local" and not constants.measured:
        label += "; `tunelab bench calibrate` measures this device"
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
    job, b = base.job, base.job.batch
    variants: list[tuple[str, Job]] = []
    # The step inside backward needs grad_accum 1 (config refuses more): no split of the micro-batch there.
    splittable = not base.fits and not job.optimizer.optimizer_in_backward
    split = accumulation_split(b.micro_batch, b.grad_accum, base.max_micro_batch) if splittable else None
    if split is not None:
        mb, accum = split
        variants.append(
            (
                f"micro-batch {b.micro_batch} -> {mb}, grad_accum {b.grad_accum} -> {accum} (same rows per "
                "optimizer step), for memory",
                job.but(micro_batch=mb, grad_accum=accum),
            )
        )
    if job.hf is not None:  # an HF script changes its own choices; packing is its `padding`
        variants += [(f"--hf {label}", job.but(hf=spec)) for label, spec in hfstack.alternatives(job.hf)]
    elif not b.packing:
        variants.append(("packing on", job.but(packing=True)))
    if job.compute.grad_ckpt:
        variants.append(("gradient checkpointing off", job.but(grad_ckpt=False)))
    shorter, why = shortest_seq_len(lengths, job.goal.sequences)
    if shorter < b.seq_len:
        variants.append((f"seq_len {b.seq_len} -> {shorter} ({why})", job.but(seq_len=shorter)))
    if not base.fits and job.method.quantized is not None and job.adapter.quant == "none":
        quantized = methods.get(job.method.quantized)
        variants.append(
            ("QLoRA (nf4 base) for memory", job.but(method=quantized.name, base_quant=quantized.base_quant))
        )
    if not base.fits and not job.compute.grad_ckpt:
        variants.append(("gradient checkpointing on, for memory", job.but(grad_ckpt=True)))
    if not base.fits:
        variants += frugal_variant(arch, lengths, base)
    out = []
    for label, v in variants:
        e = estimate(arch, lengths, v, base.device, base.gpus, base.sharding)
        # A speed change that saves under 1% is noise in this model; memory changes are always shown.
        if "for memory" in label or base.time_s - e.time_s > 0.01 * base.time_s:
            out.append(Suggestion(label, e.time_s, base.time_s - e.time_s, e.memory.total, e.fits))
    return sorted(out, key=lambda x: -x.saved_s)


def memory_levers(job: Job, cuda: bool) -> list[tuple[str, dict]]:
    """The memory levers a job can still pull, each (its name, its config changes): a smaller-state optimizer
    (optimizers.py: the 8-bit one, paged on CUDA), the step inside backward (where grad_accum is 1: accumulation
    would need the whole gradient) and, under full fine-tuning, bf16 weights."""
    levers = []
    small = min(
        (o for o in optimizers.REGISTRY.values() if o.bitsandbytes and o.needs_cuda == cuda),
        key=lambda o: o.state_bytes,
        default=None,
    )
    if small is not None and small.state_bytes < job.optim.state_bytes:
        levers.append((small.name, {"optimizer": small.name}))
    if not job.optimizer.optimizer_in_backward and job.batch.grad_accum == 1 and job.optim.in_backward:
        levers.append(("optimizer_in_backward", {"optimizer_in_backward": True, "max_grad_norm": 0.0}))
    if job.method.trains_base and job.weight_bytes == 4:
        levers.append(("bf16 weights", {"weights": "bf16"}))
    if not job.compute.grad_ckpt:
        levers.append(("gradient checkpointing", {"grad_ckpt": True}))
    return levers


def frugal_variant(arch: Arch, lengths: workload.Lengths, base: Estimate) -> list[tuple[str, Job]]:
    """The cheapest combination of memory levers that fits: fewest levers first (each costs speed or exactness),
    then the lowest peak; labelled with its peak's longest seq_len. None fits: all of them, said so."""
    levers = memory_levers(base.job, base.device.gpu.device_type == "cuda")
    trials = []
    for n in range(1, len(levers) + 1):
        for combo in itertools.combinations(levers, n):
            changes = {k: v for _, c in combo for k, v in c.items()}
            job = base.job.but(**changes)
            e = estimate(arch, lengths, job, base.device, base.gpus, base.sharding)
            # None fitting, the combination with the lowest peak is the nearest miss.
            trials.append((not e.fits, n if e.fits else 0, e.memory.total, combo, job, e))
    if not trials:
        return []
    _, _, _, combo, job, e = min(trials, key=lambda t: t[:3])
    names = " + ".join(name for name, _ in combo)
    what = "fits" if e.fits else "still does not fit"
    return [(f"{names}: {what}, longest seq_len {e.max_seq_len:,}, for memory", job)]


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


def shortest_seq_len(lengths: workload.Lengths, sides: int) -> tuple[int, str]:
    """The shortest seq_len (a multiple of 8) that truncates nothing, and why. Each side of a preference pair
    (`sides` sequences per example) is cut to seq_len // sides, so there the row must hold that many times the
    longest side."""
    longest = int(lengths.lengths.max()) if lengths.lengths is not None else int(lengths.mean_tokens)
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
