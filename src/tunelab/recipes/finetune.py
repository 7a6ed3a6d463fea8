"""Training one config: config -> data -> model -> loop -> outputs, read top to bottom; `tunelab train`, bench
and the demo all run it.

Everything that can fail on user input (config, model reference, data file, output dir) is checked before
the first byte is written to the output dir, so a failed start leaves nothing half-written.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import allocator, families, methods, objectives, optimizers, sources
from .. import config as cfgmod
from ..config import TrainConfig
from ..data.examples import TokenizedData, loss_tokens
from ..data.formats import use_default_chat_template
from ..data.packing import packing_efficiency
from ..data.pipeline import prepare_split
from ..device import (
    Precision,
    device_memory_bytes,
    device_name,
    out_of_memory,
    pick_device,
    pick_precision,
)
from ..errors import OutOfMemory, TunelabError
from ..memwatch import MemoryWatch
from ..model import attention, offload
from ..model import load as mload
from ..model.adapters import apply_adapter
from ..model.lora_linear import has_lora_dropout, has_nf4_base
from ..runtime import ACTIVATION_MEMORY_BUDGET, CompileChoice, attention_path
from ..train import checkpoint, distributed, loop, optim, pair_loss, trackers
from ..train.batches import BatchSpec, EvalBatches, Schedule
from ..train.checkpoint import TrainState
from ..train.progress import ProgressView
from . import outputs
from .outputs import BEST, restore_best, save_final, save_pretrained
from .predict import run_compile_choice
from .strategy import Strategy, Trainee, pick_strategy
from .summary import RunSummary


@dataclass(kw_only=True)
class Prepared:
    """What a run needs before the model loads; `plan` and `bench` reuse it."""

    device: torch.device
    precision: Precision
    source: sources.ModelSource
    model_config: object
    tokenizer: object
    data: TokenizedData
    schedule: Schedule
    eval_data: TokenizedData | None = None
    eval_batches: EvalBatches | None = None
    notes: tuple[str, ...] = ()  # one line each, printed before training (defaults the run chose for the user)
    compile: CompileChoice | None = None  # whether the blocks compile, and why


def prepare_run(cfg: TrainConfig, procs: distributed.Processes | None = None) -> Prepared:
    """`procs`: this process's rank and device in a data-parallel run (batches are sharded by rank)."""
    device = pick_device(cfg.compute.device) if procs is None else procs.device
    rank, world = (0, 1) if procs is None else (procs.rank, procs.world)
    precision = pick_precision(cfg.compute.precision, device)
    source = sources.resolve(cfg.model, cfg.trust_remote_code)
    model_config = sources.model_config(source)
    families.check(model_config, cfg.model, cfg.compute.attention)
    mload.check_weights(source)
    limit = sources.max_positions(model_config)
    if limit is not None and cfg.batch.seq_len > limit:
        raise TunelabError(f"seq_len {cfg.batch.seq_len} is over the model's limit of {limit} positions; lower seq_len")
    if not cfg.data.given:
        raise TunelabError(
            "data.path is not set; point it at a .jsonl/.json/.csv/.parquet file or hf://owner/name (or set data.mix)"
        )
    tokenizer = sources.load_tokenizer(source)
    notes = tuple(n for n in (use_default_chat_template(tokenizer, cfg.data.format, cfg.model),) if n)
    data, eval_data = prepare_split(*cfg.data_specs(), tokenizer)
    batch = batch_spec(cfg, tokenizer.pad_token_id)
    schedule = Schedule(data, batch, cfg.batch.epochs, cfg.batch.max_steps, rank, world)
    eval_batches = None if eval_data is None else EvalBatches(eval_data, batch, schedule.slots, rank, world)
    compiled = run_compile_choice(cfg, data)
    return Prepared(
        device=device,
        precision=precision,
        source=source,
        model_config=model_config,
        tokenizer=tokenizer,
        data=data,
        schedule=schedule,
        eval_data=eval_data,
        eval_batches=eval_batches,
        notes=(*notes, compiled.why),
        compile=compiled,
    )


def batch_spec(cfg: TrainConfig, pad_id: int) -> BatchSpec:
    objective = cfg.objective.row
    return BatchSpec(cfg.batch, cfg.run.seed, pad_id, group=objective.sequences, mean_over=objective.mean_over)


def training_attention(device: torch.device, choice: str = "auto", sinks: bool = False) -> str:
    """The `attn_implementation` for the `attention` setting on `device` (runtime.attention_path); `sinks`: the
    model's attention has sink logits (families.has_sinks)."""
    import importlib.util

    flash = device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None
    path = attention_path(choice, device.type, flash, sinks)
    if path == "flash":
        return "flash_attention_2"
    return "sdpa" if path == "sdpa" else attention.register(path)


def build_model(
    cfg: TrainConfig, prep: Prepared, device: torch.device | None = None, meta: bool = False, attn: str | None = None
) -> torch.nn.Module:
    """The model to train, on `device` (default: the run's), or with meta tensors for weights (`meta`); `attn`: the
    attn_implementation (default: the `attention` setting's, training_attention)."""
    # Frozen base weights live in the compute dtype (no per-forward cast of fp32 weights under autocast);
    # full fine-tuning keeps fp32 master weights, which apply_adapter ensures.
    model = mload.load_model(
        prep.source,
        prep.precision.compute,
        cfg.adapter.quant,
        device or prep.device,
        attn=attn or training_attention(prep.device, cfg.compute.attention, families.has_sinks(prep.model_config)),
        meta=meta,
    )
    model = apply_adapter(model, cfg.adapter)
    # tunelab checkpoints (and offloads) around each decoder layer's call itself: transformers' own checkpointing
    # sits inside the compiled region from 5.25 on.
    offload.apply(model, cfg.compute.activation_offload, cfg.compute.grad_ckpt)
    if prep.compile is not None and prep.compile.chosen:
        compile_blocks(model)
    return model


def compile_blocks(model: torch.nn.Module) -> None:
    """torch.compile each decoder block in place (regional compilation, as torchtune and torchtitan do).

    All blocks share one graph (parameters are graph inputs), so the compile cost is one block's, not the
    model's. Inductor fuses the element-wise passes between the matmuls (norms, RoPE, SiLU·up, residual
    adds), which on the quickstart were half of an eager step. The attention-slot count is the same for every
    batch of a run (train/batches.Schedule); a second slot length makes that dimension dynamic, after which
    nothing recompiles.
    The final norm is compiled too: eager, its fp32 pow/mul/div passes page-fault on every fresh buffer,
    compiled they are one fused pass each way (benchmarks/design-decisions_cpu_2026-11-22.md#compiled-final-norm).

    Below a memory budget of 1.0 the partitioner recomputes cheap element-wise results (norm outputs, SiLU)
    in backward instead of keeping them (ACTIVATION_MEMORY_BUDGET). Over an nf4 base, common-subexpression
    elimination is off, so the dequantized weights are not kept either.
    """
    import torch._functorch.config as aot_config

    aot_config.activation_memory_budget = ACTIVATION_MEMORY_BUDGET
    # Over an nf4 base the fused LoRA backward dequantizes the weight again (model/lora_linear.py).
    # AOTAutograd's common-subexpression pass merged that call with the forward's, and the partitioner, which
    # cannot recompute bitsandbytes' op, then kept every dequantized bf16 weight from forward to backward.
    # With the pass off those weights are not kept
    # (benchmarks/design-decisions_cpu_2026-11-22.md#common-subexpression-pass-off-over-nf4-bases).
    # With LoRA dropout on CPU, backward draws the hashed keep mask again from its seed
    # (model/lora_linear.py); merged with the forward's draw, the mask would be kept instead.
    aot_config.cse = not (has_nf4_base(model) or has_lora_dropout(model))
    # Under LoRA the embedding is frozen: the first block's input would need no grad and every other block's would,
    # and dynamo, which guards on it, would compile the first block a graph of its own (twice the compile time).
    # While grad is on, the embedding's output requires grad, so every block runs one graph; it costs the first
    # block's input gradient, one block's share of a backward.
    embeddings = model.get_input_embeddings()
    if not embeddings.weight.requires_grad:
        embeddings.register_forward_hook(_input_requires_grad)
    decoder = model.get_decoder()
    for block in decoder.layers:
        block.compile()
    if isinstance(getattr(decoder, "norm", None), torch.nn.Module):
        decoder.norm.compile()


def _input_requires_grad(module: torch.nn.Module, inputs, output: torch.Tensor) -> None:
    """Forward hook on a frozen embedding: its output requires grad while grad is on (not under no_grad, where
    no block's input does, so evaluation and sampling keep one graph too)."""
    if torch.is_grad_enabled():
        output.requires_grad_(True)


def train(cfg: TrainConfig, show_progress: bool = True, measure: loop.Measurement | None = None) -> RunSummary:
    """The recipe of the objectives trained on the data's own sequences (sft, dpo, orpo: objectives.Objective.recipe):
    run one job and return its summary (also written to output_dir/summary.json). `measure`: what a measuring
    caller (bench, tests) asks of the run (stop early, the warm-up window, a per-step callback).

    The job holds output_dir's lock (train/lock.py) throughout: a second job there fails at once. Under
    `accelerate launch` every process trains its share of each step and only the main process touches
    output_dir (lock, metrics, checkpoints, final weights, summary).
    """
    t0 = time.perf_counter()
    out = Path(cfg.run.output_dir)
    measure = measure or loop.Measurement()
    trackers.check_available(cfg.run.report_to)
    procs = distributed.join(pick_device(cfg.compute.device))
    with outputs.held(out, procs.main), memory_errors(cfg, procs.device, out, None):
        return _train_locked(cfg, out, t0, show_progress and procs.main, measure, procs)


def finetune(cfg: TrainConfig, show_progress: bool = True, measure: loop.Measurement | None = None) -> dict:
    """`train`'s summary as summary.json holds it (a dict), for the callers that read it by key."""
    return train(cfg, show_progress, measure).as_dict()


@contextmanager
def memory_errors(cfg: TrainConfig, device: torch.device, out: Path, state: TrainState | None):
    """Out of memory becomes one line: where, at which shape, and the settings that use less (the same levers
    `tunelab plan` tries). `state` is the running loop's (None before it: loading the model and adapters)."""
    try:
        yield
    except Exception as e:
        if not out_of_memory(e):
            raise
        where = "before the first step (loading the model)" if state is None else f"in step {state.step + 1}"
        levers = ["lower micro_batch (raise grad_accum to keep the batch)"]
        if not cfg.compute.grad_ckpt:
            levers.append("grad_ckpt=true")
        quantized = methods.get(cfg.adapter.method).quantized
        if quantized is not None and cfg.adapter.quant == "none":
            levers.append(f"method={quantized}")
        kept = checkpoint.list_checkpoints(out / "checkpoints") if state is not None else []
        resume = f"; {kept[-1]} is kept: resume=true continues from it, with a smaller micro_batch too" if kept else ""
        raise OutOfMemory(
            f"out of memory on {device_name(device)} ({device_memory_bytes(device) / 2**30:.1f} GiB) {where}, "
            f"method {cfg.adapter.method}, micro_batch {cfg.batch.micro_batch} x seq_len {cfg.batch.seq_len}; try {', '.join(levers)}; "
            f"`tunelab plan --gpu local` with the same config shows which fit{resume}"
        ) from None


@dataclass(kw_only=True)
class Run:
    """One job once set up: what `fit` trains and `summarize` reports."""

    cfg: TrainConfig
    out: Path
    procs: distributed.Processes
    prep: Prepared
    packing_efficiency: float
    memwatch: MemoryWatch
    accelerator: object
    strategy: Strategy
    trainee: Trainee
    state: TrainState
    logged_first_loss: float | None  # a resumed run's first loss, logged before the interruption
    show_progress: bool


def _train_locked(
    cfg: TrainConfig, out: Path, t0: float, show_progress: bool, measure: loop.Measurement, procs: distributed.Processes
) -> RunSummary:
    run = setup(cfg, out, procs, show_progress)
    result = run_loop(run, measure)
    summary = summarize(run, result, t0)
    if procs.main:
        outputs.write_summary(out, summary.as_dict())
    return summary


def _return_pages_before_steps_with_scratch(optimizer, spec) -> None:
    """A full fine-tune on CPU whose optimizer step allocates scratch peaks inside that step; the pages backward
    freed are returned first (allocator.return_freed_pages), not held beside it. A step inside backward has no
    such moment (its scratch is one weight's, among the activations)."""
    if optimizers.get(spec.optimizer).returns_pages_before_step(spec.optimizer_in_backward):
        inner = getattr(optimizer, "optimizer", optimizer)  # Accelerate's AcceleratedOptimizer wraps it
        inner.register_step_pre_hook(_return_freed_pages)


def _return_freed_pages(optimizer, args, kwargs) -> None:  # a step pre-hook returns None or new arguments
    allocator.return_freed_pages()


def setup(cfg: TrainConfig, out: Path, procs: distributed.Processes, show_progress: bool) -> Run:
    """Everything before the first step: checkpoint to resume from, data, model, its wrapping, resumed state."""
    from accelerate.utils import set_seed

    resume_from = checkpoint.find(out / "checkpoints", cfg.run.resume)
    if resume_from is not None:
        checkpoint.check_identity(resume_from, weights_identity(cfg))
    else:
        checkpoint.refuse_earlier(out / "checkpoints", out)
    optim.check_device(cfg.optimizer, procs.device, procs.world)
    memwatch = MemoryWatch(procs.device)
    memwatch.start()  # before the model loads: CPU peak memory is relative to this RSS

    prep = prepare_run(cfg, procs)
    cpu_full = prep.device.type == "cpu" and methods.get(cfg.adapter.method).trains_base
    if cpu_full:
        allocator.decay_freed_pages(allocator.DECAY_MS)
    group = objectives.get(cfg.objective.name).sequences
    efficiency = packing_efficiency(
        prep.data.lengths, cfg.batch.seq_len, cfg.batch.micro_batch, cfg.batch.packing, cfg.run.seed, group
    )
    if show_progress:
        _print_data(cfg, prep, efficiency)

    set_seed(cfg.run.seed)
    accelerator = make_accelerator(cfg, prep.precision.name, prep.device, out)
    strategy = pick_strategy(accelerator, procs, cfg)
    trainee = strategy.setup(
        accelerator, lambda device, meta: build_model(cfg, prep, device, meta=meta), cfg.optimizer, cfg, prep
    )
    if cfg.objective.preference.precompute_reference:
        every_example = EvalBatches(prep.data, batch_spec(cfg, prep.tokenizer.pad_token_id), prep.schedule.slots)
        pair_loss.precompute(trainee.root, every_example, prep.device, len(prep.data))
    if cpu_full:
        _return_pages_before_steps_with_scratch(trainee.optimizer, cfg.optimizer)
    state = TrainState() if resume_from is None else strategy.load_checkpoint(resume_from, trainee)
    logged_first_loss = _prepare_output_dir(cfg, out, procs, resume_from, state, show_progress)
    return Run(
        cfg=cfg,
        out=out,
        procs=procs,
        prep=prep,
        packing_efficiency=efficiency,
        memwatch=memwatch,
        accelerator=accelerator,
        strategy=strategy,
        trainee=trainee,
        state=state,
        logged_first_loss=logged_first_loss,
        show_progress=show_progress,
    )


def make_accelerator(cfg: TrainConfig, precision: str, device: torch.device, out: Path):
    """The run's Accelerator: mixed precision for `precision` (device.Precision.name), and the tracker report_to
    names writing under output_dir."""
    from accelerate import Accelerator

    mixed = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[precision]
    # One job per process, as every command runs it (bench measures each point in a fresh process): Accelerate
    # keeps its settings in a process-wide singleton that a second job with another precision could not change.
    tracked = cfg.run.report_to != "none"
    return Accelerator(
        mixed_precision=mixed,
        cpu=device.type == "cpu",
        log_with=cfg.run.report_to if tracked else None,
        project_dir=str(out) if tracked else None,  # Accelerate's logging_dir: TensorBoard writes under it
    )


def _print_data(cfg: TrainConfig, prep: Prepared, efficiency: float) -> None:
    stats = prep.data.stats
    for note in prep.notes:
        print(note, flush=True)
    print(
        f"data: {stats.rows} rows -> {stats.examples} examples ({stats.truncated} truncated, {stats.dropped} dropped), "
        f"{stats.tokens_nonpad:,} tokens, {stats.tokens_loss:,} with loss, "
        f"{'packed' if cfg.batch.packing else 'padded'} efficiency {efficiency:.1%}, {prep.schedule.total_steps} steps",
        flush=True,
    )
    if prep.eval_data is not None:
        every = cfg.eval.every(cfg.run.save_steps)
        e = prep.eval_data.stats
        print(
            f"eval: {e.examples} examples ({'held out of data.path' if cfg.eval.path is None else cfg.eval.path}), "
            f"{e.tokens_loss:,} tokens with loss, "
            + (f"every {every} steps and at the end" if every else "at the end"),
            flush=True,
        )


def _prepare_output_dir(
    cfg: TrainConfig,
    out: Path,
    procs: distributed.Processes,
    resume_from: Path | None,
    state: TrainState,
    show_progress: bool,
) -> float | None:
    """The main process readies output_dir: best/ as at the checkpoint resumed from, then the logs and config.yaml
    (outputs.start_logs). Returns the first training loss a resumed run logged before."""
    if not procs.main:
        return None
    if resume_from is not None:
        out.mkdir(parents=True, exist_ok=True)
        restore_best(resume_from, out, state)
    return outputs.start_logs(cfg, out, resume_from, state.step, show_progress)


def loop_context(
    run, schedule, measure: loop.Measurement, track: bool, run_spec: cfgmod.RunConfig | None = None, **extra
) -> loop.LoopContext:
    """The shared loop's context for a set-up run of either recipe (Run, recipes/grpo.GrpoRun): its trainee as the
    strategy prepared it, `schedule` (the batch source), the run section (`run_spec`, default the config's), the
    output directory on the main process only, a checkpoint gatherer where the strategy shards; `extra`: the
    recipe's own fields (evaluation)."""
    cfg, trainee, state = run.cfg, run.trainee, run.state
    return loop.LoopContext(
        accelerator=run.accelerator,
        loss_fn=trainee.loss_fn,
        optimizer=trainee.optimizer,
        scheduler=trainee.scheduler,
        schedule=schedule,
        optim=cfg.optimizer,
        spec=loop.LoopSpec(run=run_spec or cfg.run, identity=weights_identity(cfg)),
        measure=measure,
        out_dir=run.out if run.procs.main else None,
        memwatch=run.memwatch,
        state=state,
        progress=ProgressView(schedule.total_steps, state.step, enabled=run.show_progress),
        track=track,
        gather_checkpoint=run.strategy.checkpoint_gatherer(trainee),
        **extra,
    )


def run_loop(run: Run, measure: loop.Measurement) -> loop.LoopResult:
    """The training loop, with its trackers, then the final save of a finished run."""
    cfg, out, procs, state, trainee = run.cfg, run.out, run.procs, run.state, run.trainee
    gather = run.strategy.gather(trainee, methods.get(cfg.adapter.method).adapter)
    # Trackers log from the main process only, as metrics.jsonl is written.
    tracking = trackers.setup(cfg.run.report_to, out, state.step) if procs.main else None
    with outputs.tracking(run.accelerator, tracking, cfg, run.show_progress) as track:
        evaluation = _evaluation(cfg, run.prep, trainee.model, out, procs.main, gather)
        with memory_errors(cfg, procs.device, out, state):
            result = loop.run(loop_context(run, run.prep.schedule, measure, track, evaluation=evaluation))

    finished = result.finished
    weights = gather() if finished and gather is not None else None  # every process takes part in gathering
    if finished and procs.main:
        save_final(trainee.model, run.prep.tokenizer, out, cfg.adapter.method, weights)
    if run.show_progress and result.time_limited:
        outputs.say_time_limited(cfg.run.max_minutes, state.step, run.prep.schedule.total_steps)
    if run.show_progress and state.best_step is not None:
        kept = f"; weights in {out / BEST}" if cfg.eval.keep_best else ""
        print(f"best: step {state.best_step}, eval loss {state.best_eval_loss:.4f}{kept}", flush=True)
    return result


def summarize(run: Run, result: loop.LoopResult, t0: float) -> RunSummary:
    prep = run.prep
    return outputs.summarize(
        run,
        result,
        # The longest response trained on: `tunelab eval` caps generation there (plus slack).
        data={
            **prep.data.stats.as_dict(),
            "packing_efficiency": run.packing_efficiency,
            "response_tokens_max": int(loss_tokens(prep.data).max()),
        },
        total_steps=prep.schedule.total_steps,
        packing=run.cfg.batch.packing,
        elapsed_s=time.perf_counter() - t0,
        early_stopped=result.stopped_early,
        **_eval_summary(prep, run.state),
    )


def weights_identity(cfg: TrainConfig) -> dict:
    """The settings that decide which weights are trained and their shapes: a checkpoint resumes only under them."""
    identity = {"model": cfg.model, "method": cfg.adapter.method, "base_quant": cfg.adapter.quant}
    if objectives.get(cfg.objective.name).pairs:
        identity["objective"] = cfg.objective.name
    if methods.get(cfg.adapter.method).adapter:
        targets = (
            cfg.adapter.lora.targets if isinstance(cfg.adapter.lora.targets, str) else list(cfg.adapter.lora.targets)
        )
        identity.update({"lora.r": cfg.adapter.lora.r, "lora.alpha": cfg.adapter.lora.alpha, "lora.targets": targets})
    # The optimizer state's layout and the weights' dtype: named only where they differ from the defaults, so
    # that checkpoints written before these settings existed still resume.
    o = cfg.optimizer
    for name, value, default in (
        ("optimizer", o.optimizer, "adamw"),
        ("optimizer_in_backward", o.optimizer_in_backward, False),
        ("weights", cfg.adapter.weights, "fp32"),
    ):
        if value != default:
            identity[name] = value
    return identity


def _evaluation(
    cfg: TrainConfig, prep: Prepared, model, out: Path, writer: bool = True, gather=None
) -> loop.Evaluation | None:
    """The loop's evaluation settings; with keep_best, each improvement rewrites `best/` (weights as the final
    save writes them, plus the step and eval loss they reached) from the `writer` process. `gather` (FSDP runs)
    collects the sharded weights, which every process must call."""
    if prep.eval_batches is None:
        return None

    def save_best(state: TrainState) -> None:
        weights = gather() if gather is not None else None
        if writer:
            record = {"step": state.best_step, "eval_loss": state.best_eval_loss}
            save_pretrained(model, prep.tokenizer, out / BEST, out, cfg.adapter.method, record, weights)

    spec = loop.EvalSpec(every=cfg.eval.every(cfg.run.save_steps), patience=cfg.eval.early_stopping_patience)
    if not (cfg.eval.keep_best and (writer or gather is not None)):
        return loop.Evaluation(prep.eval_batches, spec)
    return loop.Evaluation(prep.eval_batches, spec, save_best=save_best, best_dir=out / BEST if writer else None)


def _eval_summary(prep: Prepared, state: TrainState) -> dict:
    if prep.eval_batches is None:
        return {"best_step": None, "best_eval_loss": None}
    return {
        "eval_examples": prep.eval_data.stats.examples,
        "eval_tokens_nonpad": prep.eval_data.stats.tokens_nonpad,
        "eval_tokens_loss": prep.eval_batches.tokens_loss,
        "eval_tokens_padded": prep.eval_batches.tokens_padded,
        "evaluations": state.evaluations,
        "eval_s": state.eval_s,
        "best_step": state.best_step,
        "best_eval_loss": state.best_eval_loss,
    }
