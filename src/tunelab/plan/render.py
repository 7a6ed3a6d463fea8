"""Output: a terminal table, one JSON line per GPU, or a performance.md, for an `Estimate` (a run on the data's own
sequences) and for a `GeneratingPlan` (a GRPO run, plan/grpo.py) alike. Formatting only: every number comes from
one of them (formulas with tests)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

from ..io import duration, gib
from ..markdown import table as markdown_table
from . import catalog, memory, timing
from .arch import Arch
from .catalog import Price
from .estimate import Estimate, Suggestion, run_precision
from .grpo import GeneratingPlan
from .memory import MemoryBreakdown


@dataclass
class Result:
    arch: Arch
    single: Estimate
    multi: list[Estimate]
    suggestions: list[Suggestion]
    prices: list[Price]
    scenarios: list[tuple[int, Estimate]] | None = None
    tunelab: Estimate | None = None  # beside an HF stack's prediction: tunelab's own run of the same config

    def cost_usd(self, e: Estimate) -> dict[str, float]:
        hours = e.time_s / 3600
        return {p.provider: round(timing.cost(hours, p.price_per_hour, p.instances(e.gpus)), 2) for p in self.prices}

    def idle_gpus(self, e: Estimate) -> dict[str, int]:
        """GPUs paid for and not used, per provider: what a whole instance adds to a smaller run."""
        return {p.provider: p.instances(e.gpus) * p.gpus_per_instance - e.gpus for p in self.prices}


def activations_assumption(e: Estimate) -> str:
    m = e.layout
    blocks = (
        "compiled decoder blocks (norm outputs and SiLU·up recomputed in backward)"
        if e.compiled
        else "eager decoder blocks"
    )
    kept = "its probabilities" if m.attention_probs else "a log-sum-exp"
    where = f"{m.slots} slots of {m.slot_len} tokens per micro-batch" if m.slots else "whole rows"
    if m.attention == "flex":
        where += " (FlexAttention, document-causal block mask)"
    return f"activations as saved by {blocks}; attention over {where}, keeping {kept}"


def assumptions(e: Estimate) -> list[str]:
    w = e.work
    out = [
        *([e.compile_choice.why] if e.compile_choice else []),
        e.efficiency.label,
        f"peak {e.device.gpu.peak_flops / 1e12:.1f} TFLOP/s dense 16-bit ({e.device.gpu.source})"
        + (f"; note: {e.device.gpu.note}" if e.device.gpu.note else ""),
        f"workload: {w.lengths.source}",
        (
            "padded tokens: packed rows of seq_len (next-fit packing, as train does)"
            if w.batching.batch.packing
            else "padded tokens: length-grouped dynamic padding to the longest row of each micro-batch, rounded to 8 (as train does)"
        ),
        f"attention FLOPs use T = {w.epoch.widest_row} (the widest fed row), not halved for the causal mask (PaLM convention)",
        f"model load at {catalog.disk_bps()[0] / 1e9:g} GB/s, checkpoint writes at {catalog.disk_bps()[1] / 1e9:g} GB/s (assumed NVMe)",
        activations_assumption(e),
        *(
            [
                f"torch.compile's one-off cost {duration(e.overheads.compile_s)} (catalog, {e.device.gpu.device_type}, cold cache)"
            ]
            if e.overheads.compile_s
            else []
        ),
        f"runtime memory overhead {gib(e.device.runtime_overhead)} ({'calibrated' if e.device.calibration and e.device.calibration.runtime_overhead_bytes is not None else 'catalog default for the device type'})"
        + (
            f"; {gib(e.device.runtime_overhead - e.memory.runtime_overhead)} less at this peak, the optimizer step,"
            " before which the run returns the pages backward freed"
            if e.memory.runtime_overhead < e.device.runtime_overhead
            else ""
        ),
        *(
            [
                "weights: bf16 on a CPU without bf16 units: the products run in bf16 without hardware support, far"
                " slower than the fp32 rate this step time assumes"
                " (benchmarks/optimizers/full-ft-peak-phase_epyc-avx2-2c_2026-11-29.md)"
            ]
            if e.device.gpu.device_type == "cpu"
            and not e.device.gpu.bf16
            and e.job.method.trains_base
            and e.job.weight_bytes == 2
            else []
        ),
    ]
    if e.evaluations is not None:
        v = e.evaluations
        out.append(
            f"evaluation: {v.count} passes over {v.tokens_padded:,} fed held-out tokens each, forward only"
            f" ({e.forward_flops / 1e9:.2f} GFLOP/token) at the training efficiency; early stopping can end sooner"
        )
    return out


def record(r: Result, e: Estimate) -> dict:
    w = e.work
    return {
        "gpu": e.device.gpu.id,
        "gpu_name": e.device.gpu.name,
        "gpus": e.gpus,
        "sharding": e.sharding,
        "comm_bytes_per_step": e.comm_bytes,
        **({"host_load_bytes": memory.host_load_bytes(r.arch, e.job, e.layout)} if e.sharding == "zero3" else {}),
        "model": r.arch.name,
        "total_params": r.arch.total_params,
        "active_params": r.arch.active_params,
        **({"moe": moe_record(r.arch, e)} if r.arch.moe is not None else {}),
        "method": e.job.adapter.method,
        "base_quant": e.job.adapter.quant,
        "tokens_per_s": e.speed.tokens_per_s,
        "tokens_nonpad_per_s": e.speed.tokens_per_s * w.tokens_nonpad / w.tokens_padded,
        "time_s": e.time_s,
        "train_s": e.speed.train_s,
        **({"time_limited_from_steps": e.time_limited_from} if e.time_limited_from else {}),
        "overheads_s": {
            "model_load": e.overheads.model_load_s,
            "compile": e.overheads.compile_s,
            "checkpoints": e.overheads.checkpoint_s,
            **({"evaluation": e.overheads.eval_s} if e.evaluations is not None else {}),
        },
        **(
            {"evaluations": e.evaluations.count, "eval_tokens_padded": e.evaluations.tokens_padded}
            if e.evaluations is not None
            else {}
        ),
        "compile": e.compile_choice.as_dict() if e.compile_choice else None,
        "peak_memory_bytes": e.memory.total,
        "memory_breakdown": e.memory.as_dict(),
        "memory_figures": dataclasses.asdict(e.figures),
        "memory_capacity_bytes": e.device.gpu.memory_bytes,
        "fits": e.fits,
        "max_micro_batch": e.max_micro_batch,
        "max_seq_len": e.max_seq_len,
        **(
            {"activation_offload_host_bytes": memory.offloaded_bytes(r.arch, e.job, e.layout)}
            if e.layout.offload
            else {}
        ),
        "optimizer_steps": w.optimizer_steps,
        "steps_per_epoch": w.steps_per_epoch,
        "checkpoints_written": e.checkpoints.written,
        "checkpoints_kept": e.checkpoints.kept,
        "examples": w.lengths.examples,
        "tokens_total_nonpad": w.tokens_nonpad,
        "tokens_total_padded": w.tokens_padded,
        "tokens_total_loss": w.tokens_loss,
        "tokens_upper_bound": w.tokens_upper_bound,
        "flops_per_token": e.flops.model,
        "hardware_flops_per_token": e.flops.hardware,
        "peak_flops": e.device.gpu.peak_flops,
        "efficiency": e.efficiency.value,
        "step_s": e.step.as_dict() if e.step is not None else None,
        "step_constants": e.constants.label if e.constants is not None else None,
        "stack": e.job.stack,
        **({"hf": e.job.hf.label(e.job.adapter.quant != "none")} if e.job.hf is not None else {}),
        **(
            {"tunelab_time_s": r.tunelab.time_s, "tunelab_memory_bytes": r.tunelab.memory.total}
            if r.tunelab is not None and e is r.single
            else {}
        ),
        "cost_usd": r.cost_usd(e),
        "assumptions": assumptions(e),
    }


def longest_label(arch: Arch, e: Estimate) -> str:
    """plan's longest packed row that fits (memory.max_seq_len), with the model's own position limit beside it,
    and the host memory that activation offloading then holds."""
    text = f"{e.max_seq_len:,} tokens (memory model, rows packed full)" if e.max_seq_len else "not even 128 tokens"
    if 0 < arch.max_positions < e.max_seq_len:
        text += f"; the model's limit is {arch.max_positions:,} positions"
    if e.layout.offload:
        held = gib(memory.offloaded_bytes(arch, e.job, e.layout))
        text += f"; at seq_len {e.job.batch.seq_len:,} activation_offload holds {held} in pinned host memory"
    return text


def params_label(arch) -> str:
    """Total parameters, and an MoE model's active ones (a token's top_k experts, shared expert, attention, router)."""
    total = f"{arch.total_params / 1e9:.3f} B params"
    return total if arch.moe is None else f"{total}, {arch.active_params / 1e9:.3f} B active per token"


def moe_record(arch, e: Estimate) -> dict:
    m = arch.moe
    return {
        "family": m.family,
        "experts": m.experts,
        "top_k": m.top_k,
        "expert_width": m.expert_width,
        "shared_width": m.shared_width,
        "sparse_layers": arch.sparse_layers,
        "imbalance": e.job.moe.imbalance,
    }


def moe_lines(arch, e: Estimate) -> list[str]:
    """What plan assumed of an MoE model's routing: FLOPs from the active parameters, memory from all of them, the
    expert part's time from the most loaded expert."""
    m = arch.moe
    if m is None:
        return []
    f = e.job.moe.imbalance
    load = "uniform routing, assumed (--moe-imbalance F)" if f == 1 else "moe.imbalance"
    shared = f" + a {m.shared_width}-wide shared expert" if m.shared_width else ""
    return [
        f"  MoE ({m.family}): {m.top_k} of {m.experts} experts ({m.expert_width} wide){shared} per token in "
        f"{arch.sparse_layers} of {arch.layers} layers; FLOPs from the active parameters, memory from all; "
        f"most loaded expert {f:g}x the mean ({load})"
    ]


def json_line(r: Result) -> str:
    out = record(r, r.single)
    out["multi_gpu"] = [{k: v for k, v in record(r, m).items() if k != "assumptions"} for m in r.multi]
    out["suggestions"] = [s.__dict__ for s in r.suggestions]
    return json.dumps(out)


# The breakdown's terms shown only where the run has them.
WHERE_PRESENT = ("dequant_scratch", "zero_buffers")


def breakdown_lines(m: MemoryBreakdown) -> list[str]:
    shown = {k: v for k, v in m.as_dict().items() if v or k not in WHERE_PRESENT}
    return [f"    {k.replace('_', ' '):<18} {gib(v):>12}" for k, v in shown.items()]


def figure_line(e: Estimate) -> str:
    """Which figure the peak is, beside the other two a published peak may be (memory.Figures)."""
    f = e.figures
    if e.device.gpu.device_type != "cuda":
        return (
            f"  memory figures: the peak is the process's resident memory; the model's terms alone {gib(f.allocated)}"
        )
    varied = (
        f", less the {gib(e.varied_reserve)} the allocator keeps for rows of varied width" if e.varied_reserve else ""
    )
    return (
        f"  memory figures: allocated {gib(f.allocated)} (max_memory_allocated, torchtune's peak_memory_active), "
        f"reserved {gib(f.reserved)} (max_memory_reserved), process {gib(f.process)} (nvidia-smi, CUDA context "
        f"included): the peak above is the process's{varied}"
    )


def time_limit_lines(e) -> list[str]:
    if not e.time_limited_from:
        return []
    return [
        f"  time limit: max_minutes {e.job.run.max_minutes:g} ends training after {e.work.optimizer_steps:,} of the "
        f"schedule's {e.time_limited_from:,} steps; tokens, time and cost here are those steps'"
    ]


def step_lines(e: Estimate) -> list[str]:
    """One optimizer step by part (plan/steptime.py): what bounds the run, and where the constants come from."""
    b = e.step
    if b is None:
        return []
    parts = {"matmul": b.matmul_s, "attention": b.attention_s, "memory-bound": b.memory_s, "fixed": b.fixed_s}
    bound = max(parts, key=lambda k: parts[k])
    shown = ", ".join(f"{k} {v * 1e3:,.1f} ms ({v / b.total:.0%})" for k, v in parts.items())
    mode = "compiled" if e.compiled and e.job.hf is None else "eager"
    bound = bound.removesuffix("-bound") + "-bound"  # "memory-bound", not "memory-bound-bound"
    lines = [f"  step ({e.job.stack}, {mode}): {b.total * 1e3:,.1f} ms = {shown}; {bound}"]
    g, record = e.device.gpu, e.device.calibration
    if g.id == "local" and g.device_type == "cpu" and g.bandwidth_gbs:
        from_record = record is not None and math.isclose(record.bandwidth_bps or 0.0, g.bandwidth_gbs * 1e9)
        where = "calibration record" if from_record else "copy probe"
        lines.append(f"  memory bandwidth: {g.bandwidth_gbs:.1f} GB/s ({where}), the memory-bound part's measure")
    if e.constants is not None and e.constants.rows:
        lines.append(
            f"  step constants fitted on: {'; '.join(e.constants.rows[:3])}"
            + (" ..." if len(e.constants.rows) > 3 else "")
        )
    return lines


def stack_lines(r: Result) -> list[str]:
    """For an HF stack's prediction: the script's choices plan assumed, and what tunelab's own run of the same
    config would take and hold beside it."""
    e, own = r.single, r.tunelab
    if e.job.hf is None:
        return []
    b, c = e.job.batch, e.job.compute
    lines = [
        f"  HF script assumed: {e.job.hf.label(e.job.adapter.quant != 'none')}, gradient_checkpointing={c.grad_ckpt}, "
        f"per_device_train_batch_size={b.micro_batch}, gradient_accumulation_steps={b.grad_accum}, "
        f"{run_precision(c.precision, e.device)}, PEFT LoRA r={e.job.adapter.lora.r} (--hf KEY=VALUE changes them)"
    ]
    if own is not None:
        mode = "compiled" if own.compiled else "eager"
        saved = e.time_s - own.time_s
        lines.append(
            f"  tunelab with this config ({'packed' if own.job.batch.packing else 'padded'}, {mode}): "
            f"{duration(own.time_s)}, peak {gib(own.memory.total)}: "
            + (f"saves {duration(saved)} ({e.time_s / own.time_s:.2f}x)" if saved > 0 else f"costs {duration(-saved)}")
            + f" and {gib(abs(e.memory.total - own.memory.total))} {'less' if own.memory.total <= e.memory.total else 'more'} memory"
        )
    return lines


def side_by_side(r: Result, tool: str) -> list[str]:
    """The other tool's run (r.single, its stack) and tunelab's own run of the same job (r.tunelab; the same
    estimate where plan models the tool with tunelab's step), one line each: tokens/s, step, time, peak."""
    e = r.single

    def line(name: str, x: Estimate) -> str:
        step = x.step.total if x.step is not None else 0.0
        return (
            f"  {name}: {x.speed.tokens_per_s:,.0f} tokens/s fed, step {step * 1000:,.1f} ms, "
            f"{x.work.optimizer_steps:,} steps, {duration(x.time_s)}, peak {gib(x.memory.total)}"
        )

    g = e.device.gpu
    out = [f"plan on {g.name} ({g.id}), {r.arch.name}, {e.job.adapter.method}:"]
    if r.tunelab is None:
        return [*out, line(f"{tool} and tunelab (plan models both with tunelab's step)", e)]
    return [*out, line(f"{tool} (stack {e.job.stack})", e), line("tunelab, the same job", r.tunelab)]


def table(results: list[Result]) -> str:
    lines = []
    for r in results:
        e, w, f = r.single, r.single.work, r.single.flops
        g = e.device.gpu
        lines += [
            f"== {g.name} ({g.id}) : {r.arch.name}, {e.job.adapter.method}"
            + (f" ({e.job.adapter.quant} base)" if e.job.adapter.quant != "none" else ""),
            f"  model: {params_label(r.arch)} ({r.arch.source})",
            *moe_lines(r.arch, e),
            f"  FLOPs/token: {f.model / 1e9:.2f} GFLOP model (dense {f.dense / 1e9:.2f} + attention {f.attention / 1e9:.2f}"
            f" + adapters {f.adapters / 1e9:.3f}); recomputation {f.recompute / 1e9:.2f} -> {f.hardware / 1e9:.2f} hardware",
            f"  tokens: {w.tokens_nonpad:,} non-padding, {w.tokens_loss:,} with loss, {w.tokens_padded:,} fed (padded, {w.padding_fraction:.1%} padding);"
            f" naive upper bound examples x seq_len x epochs = {w.tokens_upper_bound:,}",
            f"  steps: {w.optimizer_steps:,} optimizer steps ({w.steps_per_epoch:,}/epoch); checkpoints {e.checkpoints.written} written, {e.checkpoints.kept} kept, + final save"
            + (f"; {e.evaluations.count} evaluations" if e.evaluations is not None else ""),
            *time_limit_lines(e),
            f"  speed: {e.speed.tokens_per_s:,.0f} tokens/s fed ({e.efficiency.label})",
            *step_lines(e),
            f"  time: train {duration(e.speed.train_s)} + model load {duration(e.overheads.model_load_s)}"
            + (f" + compile {duration(e.overheads.compile_s)}" if e.overheads.compile_s else "")
            + f" + checkpoints {duration(e.overheads.checkpoint_s)}"
            + (f" + evaluation {duration(e.overheads.eval_s)}" if e.evaluations is not None else "")
            + f" = {duration(e.time_s)}",
            *([f"  {e.compile_choice.why}"] if e.compile_choice and e.job.hf is None else []),
            f"  memory: peak {gib(e.memory.total)} of {gib(g.memory_bytes)} -> {'fits' if e.fits else 'DOES NOT FIT'};"
            f" largest micro-batch that fits: {e.max_micro_batch}",
            f"  longest seq_len that fits at micro-batch {e.job.batch.micro_batch}: {longest_label(r.arch, e)}",
            *breakdown_lines(e.memory),
            figure_line(e),
            *stack_lines(r),
        ]
        idle = r.idle_gpus(e)
        for provider, usd in r.cost_usd(e).items():
            paid = f" (the whole instance: {e.gpus + idle[provider]} GPUs for {e.gpus})" if idle[provider] else ""
            lines.append(f"  cost: ${usd:,.2f} at {provider}{paid}")
        for m in r.multi:
            lines.append(
                f"  x{m.gpus} {m.sharding}: {gib(m.memory.total)}/GPU ({'fits' if m.fits else 'does not fit'}),"
                f" {duration(m.time_s)}, {m.work.optimizer_steps:,} steps (scaling efficiency assumed),"
                f" sends {gib(m.comm_bytes)}/GPU per step"
            )
        sharded = [m for m in r.multi if m.sharding == "zero3"]
        if r.multi and not sharded:
            lines.append(
                f"  x{r.multi[0].gpus} zero3: none over a quantized base ({e.job.adapter.quant}; FSDP shards floating-point"
                " weights only)"
            )
        if sharded:
            load = memory.host_load_bytes(r.arch, sharded[0].job, sharded[0].layout)
            lines.append(
                f"  x{sharded[0].gpus} zero3 with FSDP (fsdp2.yaml): CPU memory to load {gib(load)} on the main"
                f" process, which sends the shards; {gib(load * sharded[0].gpus)} if every process reads the weights"
            )
        for s in r.suggestions:
            if abs(s.saved_s) < 0.01 * s.time_s:
                delta = "same time"
            else:
                delta = f"{'saves' if s.saved_s >= 0 else 'costs'} {duration(abs(s.saved_s))}"
            lines.append(
                f"  try: {s.change}: {duration(s.time_s)} ({delta}),"
                f" peak {gib(s.peak_memory_bytes)}{'' if s.fits else ' (does not fit)'}"
            )
        lines.append("")
    return "\n".join(lines).rstrip()


def _comparison_table(results: list[Result]) -> list[str]:
    rows = []
    for r in results:
        e = r.single
        costs = r.cost_usd(e)
        cheapest = min(costs.items(), key=lambda kv: kv[1]) if costs else None
        rows.append(
            [
                e.device.gpu.name,
                f"{e.device.gpu.peak_flops / 1e12:.1f}",
                f"{e.efficiency.value:.2f}",
                f"{e.speed.tokens_per_s:,.0f}",
                duration(e.speed.train_s),
                duration(e.time_s),
                gib(e.memory.total),
                "yes" if e.fits else "no",
                str(e.max_micro_batch),
                f"${cheapest[1]:,.2f} ({cheapest[0]})" if cheapest else "no price",
            ]
        )
    header = "GPU, dense TFLOP/s, efficiency, tokens/s, train, total, peak memory, fits, max micro-batch, cheapest cost"
    return markdown_table(header.split(", "), rows)


def _multi_gpu_table(results: list[Result]) -> list[str]:
    multi_rows = [
        [
            m.device.gpu.name,
            m.sharding,
            gib(m.memory.total),
            "yes" if m.fits else "no",
            duration(m.time_s),
            gib(m.comm_bytes),
        ]
        for r in results
        for m in r.multi
    ]
    header = ["GPU", "strategy", "memory per GPU", "fits", "total time", "sent per GPU per step"]
    return markdown_table(header, multi_rows)


def markdown(results: list[Result], title: str) -> str:
    first = results[0]
    e0 = first.single
    adapter, b, compute = e0.job.adapter, e0.job.batch, e0.job.compute
    out = [
        f"# Performance plan: {title}",
        "",
        f"Generated by `tunelab plan`. Model {first.arch.name} ({params_label(first.arch)}), method {adapter.method}"
        + (f" on a {adapter.quant} base" if adapter.quant != "none" else "")
        + f", seq_len {b.seq_len}, micro-batch {b.micro_batch} x grad-accum {b.grad_accum}, {b.epochs:g} epochs,"
        f" packing {'on' if b.packing else 'off'}, gradient checkpointing {'on' if compute.grad_ckpt else 'off'}.",
        "",
        "## Workload",
        "",
        f"- {e0.work.lengths.source}",
        f"- tokens: {e0.work.tokens_nonpad:,} non-padding, {e0.work.tokens_loss:,} with loss, {e0.work.tokens_padded:,} fed;"
        f" the naive `examples x seq_len x epochs` = {e0.work.tokens_upper_bound:,} is only an upper bound",
        f"- {e0.work.optimizer_steps:,} optimizer steps; checkpoints: {e0.checkpoints.written} written, {e0.checkpoints.kept} kept",
        f"- FLOPs per token: {e0.flops.model / 1e9:.2f} GFLOP (model), {e0.flops.hardware / 1e9:.2f} GFLOP with recomputation",
        "",
        "## GPU comparison",
        "",
    ]
    out += _comparison_table(results)
    if any(r.scenarios for r in results):
        sizes = [n for n, _ in results[0].scenarios]
        out += [
            "",
            "## Runtime scenarios",
            "",
            "Same settings and mean example length, different dataset sizes (total time including overheads).",
            "",
        ]
        scenario_rows = [
            [r.single.device.gpu.name]
            + [f"{duration(e.time_s)} ({e.work.tokens_padded / 1e6:.2f}M tokens fed)" for _, e in r.scenarios]
            for r in results
        ]
        out += markdown_table(["GPU", *(f"{n:,} examples" for n in sizes)], scenario_rows)
    f = e0.flops
    out += [
        "",
        "## Scaling factors",
        "",
        "- time = tokens fed x FLOPs per token / (peak x efficiency): linear in examples and epochs;",
        f"- per token, {(f.dense + f.adapters) / 1e9:.2f} GFLOP do not depend on seq_len and {f.attention / 1e9:.3f} GFLOP grow linearly"
        f" with it (attention), so halving seq_len without truncating saves only the padding and the attention share"
        f" ({f.attention / f.model:.1%} of the model FLOPs here);",
        f"- gradient checkpointing adds {f.recompute / f.model:.0%} hardware FLOPs when on; packing removes padding"
        f" ({e0.work.padding_fraction:.1%} of fed tokens here).",
    ]
    if results[0].multi:
        out += [
            "",
            f"## Multi-GPU (x{results[0].multi[0].gpus})",
            "",
        ]
        out += _multi_gpu_table(results)
    out += ["", "## Recommendations", ""]
    for r in results:
        for sug in r.suggestions:
            out.append(
                f"- {r.single.device.gpu.name}: {sug.change}: {duration(sug.time_s)}"
                f" ({'saves' if sug.saved_s >= 0 else 'costs'} {duration(abs(sug.saved_s))}), peak {gib(sug.peak_memory_bytes)}"
                + ("" if sug.fits else ", does not fit")
            )
        if not r.single.fits:
            out.append(
                f"- {r.single.device.gpu.name}: does not fit at micro-batch {b.micro_batch}; largest that fits: {r.single.max_micro_batch}"
            )
    out += ["", "## Assumptions", ""]
    seen = []
    for r in results:
        for a in assumptions(r.single):
            if a not in seen:
                seen.append(a)
    out += [f"- {a}" for a in seen]
    out += ["- memory breakdown (first GPU): " + ", ".join(f"{k} {gib(v)}" for k, v in e0.memory.as_dict().items())]
    return "\n".join(out)


def generating_record(p: GeneratingPlan) -> dict:
    """A GRPO plan on one device as its JSON line's record."""
    gen = p.step.generation
    return {
        "device": p.device,
        "objective": "generating",
        "prompts": p.prompts,
        "prompt_tokens_mean": p.prompt_tokens,
        "rows_per_batch": gen.rows,
        "batches": p.batches,
        **({"time_limited_from_batches": p.time_limited_from} if p.time_limited_from else {}),
        "decode_steps": gen.completion_tokens,
        "update_share": p.step.signal_share,
        "batch_s": p.step.batch_s,
        "parts_s": p.step.parts(),
        "time_s": p.time_s,
        "kv_cache_bytes": gen.kv_cache_bytes,
        "memory_bytes": p.memory_bytes,
        "memory_breakdown": p.memory_parts,
        "source": p.source,
    }


def generating_json_line(p: GeneratingPlan) -> str:
    return json.dumps(generating_record(p))


def generating_text(p: GeneratingPlan) -> str:
    """A GRPO plan on one device for the terminal: a generation batch by part, the run, the memory, what is assumed."""
    gen = p.step.generation
    parts = ", ".join(f"{k} {v:.2f} s" for k, v in p.step.parts().items())
    return (
        f"{p.device}: {p.source}\n"
        f"  a generation batch: {gen.rows} completions after {p.prompt_tokens:.0f}-token prompts, "
        f"{gen.completion_tokens:g} decode steps, the update over {p.step.signal_share:.0%} of them: "
        f"{p.step.batch_s:.2f} s ({parts})\n"
        f"  {p.batches} batches: {p.time_s / 60:.1f} min; memory {p.memory_bytes / 2**30:.2f} GiB "
        f"(KV cache {gen.kv_cache_bytes / 2**20:.0f} MiB, the sampler's packed weights "
        f"{p.memory_parts.get('sampling packed weights', 0) / 2**20:.0f} MiB)\n"
        f"  assumed: {p.assumption}"
        + (
            f"\n  time limit: max_minutes ends training after {p.batches} of the schedule's {p.time_limited_from} batches"
            + ("; schedule_within_limit ends the learning-rate schedule there" if p.schedule_fitted else "")
            if p.time_limited_from
            else ""
        )
    )


def generating_table(plans: list[GeneratingPlan]) -> str:
    return "\n".join(generating_text(p) for p in plans)


def generating_markdown(plans: list[GeneratingPlan], title: str) -> str:
    """A GRPO plan's performance.md: the workload, the devices side by side, each batch by part, the assumptions."""
    first = plans[0]
    gen = first.step.generation
    out = [
        f"# Performance plan: {title}",
        "",
        "Generated by `tunelab plan` for a GRPO run: each generation batch samples the completions, scores them and "
        "trains on them.",
        "",
        "## Workload",
        "",
        f"- {first.source}",
        f"- a generation batch: {gen.rows} completions after {first.prompt_tokens:.0f}-token prompts, "
        f"{gen.completion_tokens:g} decode steps, the update over {first.step.signal_share:.0%} of them",
        "",
        "## GPU comparison",
        "",
    ]
    rows = [
        [p.device, f"{p.step.batch_s:.2f} s", f"{p.batches:,}", duration(p.time_s), gib(p.memory_bytes)]
        + [gib(p.step.generation.kv_cache_bytes)]
        for p in plans
    ]
    out += markdown_table(["GPU", "batch", "batches", "time", "memory", "KV cache"], rows)
    out += ["", "## A generation batch by part", ""]
    parts = list(first.step.parts())
    out += markdown_table(
        ["GPU", *parts], [[p.device, *(f"{v:.2f} s" for v in p.step.parts().values())] for p in plans]
    )
    out += ["", "## Assumptions", ""]
    seen = []
    for p in plans:
        if p.assumption not in seen:
            seen.append(p.assumption)
    out += [f"- {a}" for a in seen]
    out += [
        f"- {p.device}: max_minutes ends training after {p.batches} of the schedule's {p.time_limited_from} batches"
        for p in plans
        if p.time_limited_from
    ]
    if first.memory_parts:
        out += ["- memory breakdown (first GPU): " + ", ".join(f"{k} {gib(v)}" for k, v in first.memory_parts.items())]
    return "\n".join(out)
