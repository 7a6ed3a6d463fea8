"""The training loop: gradient accumulation, clipping, the optimizer step (train/optim.py builds it), schedule, logging, evaluation, checkpoints.

Built on Accelerate (`backward`, `no_sync`, `clip_grad_norm_`, loss scaling for fp16) so DDP/FSDP come
without a rewrite. The only host syncs are at log steps (the loss `.item()`), at evaluations, at checkpoint
saves, and at the edges of the steady-state timing window.
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import OptimizerConfig, RunConfig
from ..data.packing import Batch
from ..device import synchronize, to_device
from ..memwatch import MemoryWatch
from . import checkpoint
from .batches import BatchSource, EvalBatches
from .checkpoint import TrainState
from .progress import LogLine, ProgressView


@dataclass(frozen=True, kw_only=True)
class LoopSpec:
    # How often the run logs and saves, and how many checkpoints it keeps (the config's run section).
    run: RunConfig = field(default_factory=RunConfig)
    # Settings that shape the trainable weights, stored in each checkpoint (checkpoint.check_identity).
    identity: dict | None = None


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What a measuring caller (bench, tests) asks of a run beyond training it; a plain run uses the defaults."""

    # Stop before the schedule's end (bench windows, tests of resume) without changing the schedule.
    stop_at: int | None = None
    # Steps excluded from the steady-state window (first-step allocation, lazy init, compile).
    warmup_window: int = 2
    # Called with the step number after each optimizer step, its log and evaluation included.
    on_step: Callable[[int], None] | None = None


@dataclass(frozen=True)
class EvalSpec:
    every: int  # optimizer steps between evaluations; 0: only at the schedule's end (always evaluated)
    patience: int | None = None  # stop after this many evaluations in a row without a lower eval loss


@dataclass
class Evaluation:
    batches: EvalBatches
    spec: EvalSpec
    save_best: Callable[[TrainState], None] | None = None  # called after each evaluation that improves
    best_dir: Path | None = None  # where save_best writes: each checkpoint keeps a copy


@dataclass
class LoopResult:
    state: TrainState
    steps_run: int
    stopped_early: bool = False
    # Ended by the run's max_minutes before the schedule's end (`out_of_time`).
    time_limited: bool = False
    # Done: the schedule's end (a fitted one included) reached, or stopped early or by the time limit; a caller's
    # `stop_at` before the end is not.
    finished: bool = False
    losses: list[tuple[int, float]] = field(default_factory=list)
    steady_s: float = 0.0
    steady_steps: int = 0
    steady_tokens_padded: int = 0
    steady_tokens_nonpad: int = 0
    steady_tokens_loss: int = 0
    # "steady", or "all steps" for a run too short to have steps past the warm-up, whose rates then cover
    # every step it ran, warm-up included.
    rate_window: str = "steady"
    window_step_times: list[float] = field(default_factory=list)
    peak_memory_bytes: int = 0
    peak_reserved_bytes: int | None = None
    peak_absolute_bytes: int = 0

    def rates(self) -> dict:
        """Window rates (tokens over the steady window's seconds) beside per-step time statistics: on an
        erratic device the two disagree, so both are reported."""
        s = self.steady_s or float("nan")
        return {
            "tokens_padded_per_s": self.steady_tokens_padded / s,
            "tokens_nonpad_per_s": self.steady_tokens_nonpad / s,
            "tokens_loss_per_s": self.steady_tokens_loss / s,
            **step_statistics(self.window_step_times),
            "steady_window_steps": self.steady_steps,
            "steady_window_s": self.steady_s,
            "rate_window": self.rate_window,
        }


def step_statistics(times: list[float]) -> dict[str, float]:
    """Median, p90 (interpolated between order statistics) and max of per-step times, in seconds;
    `step_time_s` is the median, under the name older records use."""
    if not times:
        nan = float("nan")
        return {"step_time_s": nan, "step_time_median_s": nan, "step_time_p90_s": nan, "step_time_max_s": nan}
    p90 = statistics.quantiles(times, n=10, method="inclusive")[-1] if len(times) > 1 else times[0]
    median = statistics.median(times)
    return {"step_time_s": median, "step_time_median_s": median, "step_time_p90_s": p90, "step_time_max_s": max(times)}


class _Window:
    """Token counts since `start`, for one log window's rates; `steady` once past the warm-up steps."""

    def __init__(self, start: float, steady: bool = False):
        self.start, self.steady = start, steady
        self.steps = self.padded = self.nonpad = self.loss = 0

    def add(self, padded: int, nonpad: int, loss: int) -> None:
        self.steps += 1
        self.padded += padded
        self.nonpad += nonpad
        self.loss += loss

    def tokens(self) -> dict[str, int]:
        return {"tokens_padded": self.padded, "tokens_nonpad": self.nonpad, "tokens_loss": self.loss}


def build_scheduler(optimizer: torch.optim.Optimizer, spec: OptimizerConfig, total_steps: int, at_step: int = 0):
    """The learning-rate schedule over `total_steps`; `at_step` > 0 builds it as if stepped that many times (a
    schedule shortened mid-run, ScheduleToLimit), setting the optimizer's learning rate to its value there."""
    from transformers import get_scheduler

    name = "constant_with_warmup" if spec.lr_scheduler == "constant" else spec.lr_scheduler
    scheduler = get_scheduler(
        name, optimizer, num_warmup_steps=int(spec.warmup_ratio * total_steps), num_training_steps=total_steps
    )
    if at_step:
        scheduler.last_epoch = at_step
        lrs = [base * factor(at_step) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
        for group, lr in zip(optimizer.param_groups, lrs):
            group["lr"] = lr
        scheduler._last_lr = lrs
    return scheduler


def fitted_schedule_steps(max_minutes: float, elapsed_s: float, step: int, batch_s: float, per_batch: int) -> int:
    """The step at which a run that has done `step` steps in `elapsed_s`, at `batch_s` a batch of `per_batch` steps,
    ends its last batch that still ends within `max_minutes`: where a schedule fitted to the limit ends."""
    return step + max(0, math.floor((max_minutes * 60 - elapsed_s) / max(batch_s, 1e-9))) * per_batch


# A refitted end is printed only where it moved by this share of the end last printed.
SCHEDULE_SHOWN_MOVE = 0.1


class ScheduleToLimit:
    """run.schedule_within_limit: the run and its learning-rate schedule end at the last step that the steady
    window's mean step time says still ends within max_minutes, never past the schedule's own end; fitted once the
    warm-up steps are done (their time holds compilation) and refitted after every step from then on, so a machine
    slower or faster than the config's row count assumed decays its learning rate to the end within the limit
    instead of being cut mid-schedule. A resume keeps the fitted end (TrainState.schedule_steps)."""

    def __init__(self, ctx: LoopContext, full_steps: int):
        self.ctx, self.full = ctx, full_steps
        self.shown: int | None = None  # the end last printed
        if ctx.state.schedule_steps is not None:  # a resumed run: its scheduler was rebuilt over the full schedule
            self.reschedule(ctx.state.schedule_steps)

    def end(self) -> int:
        return self.ctx.state.schedule_steps or self.full

    def update(self, meter: ThroughputMeter, world: int) -> int:
        """The end, refitted on the pace since the warm-up (the main process's, under several)."""
        ctx, state = self.ctx, self.ctx.state
        steady = meter.steady_s()
        if steady is None or meter.result.steady_steps == 0:
            return self.end()
        # Whole units of steps (BatchSource.unit: a generated batch's updates) from a step that ends one.
        unit = ctx.schedule.unit
        end = fitted_schedule_steps(
            ctx.spec.run.max_minutes, meter.elapsed_s(), state.step, steady / meter.result.steady_steps * unit, unit
        )
        end = min(max(end, state.step), self.full)
        if world > 1:
            mine = torch.tensor(float(end if ctx.accelerator.is_main_process else 0), device=ctx.accelerator.device)
            end = int(ctx.accelerator.reduce(mine, "sum").item())
        if end != self.end():
            self.reschedule(end)
            if self.shown is None or abs(end - self.shown) >= SCHEDULE_SHOWN_MOVE * self.shown:
                ctx.progress.note(
                    f"schedule: at {steady / meter.result.steady_steps:.1f} s a step, max_minutes "
                    f"{ctx.spec.run.max_minutes:.3g} holds {end} of the {self.full} steps; the learning-rate schedule "
                    f"now ends at step {end}"
                )
                self.shown = end
        return end

    def reschedule(self, end: int) -> None:
        """The schedule ends at `end`, its learning rate decaying over the steps left from where it stands."""
        ctx = self.ctx
        ctx.state.schedule_steps = end
        ctx.scheduler = build_scheduler(ctx.scheduler.optimizer, ctx.optim, end, at_step=ctx.state.step)


@dataclass(kw_only=True)
class LoopContext:
    """What one run of the loop works with: built by recipes/finetune.py, read by `run`."""

    accelerator: object
    loss_fn: torch.nn.Module  # the loss module the objective names (train/loss.CausalLMLoss, ...), prepared
    optimizer: object
    scheduler: object
    schedule: BatchSource  # train/batches.Schedule, or a generating objective's source (recipes/grpo.py)
    optim: OptimizerConfig
    spec: LoopSpec
    measure: Measurement = Measurement()
    out_dir: Path | None  # metrics.jsonl and checkpoints go here; None writes nothing (every rank but the main one)
    memwatch: MemoryWatch
    state: TrainState  # advanced in place
    progress: ProgressView
    evaluation: Evaluation | None = None
    # Send each record to the accelerator's trackers too (train/trackers.py), under the same names and step.
    track: bool = False
    # FSDP runs: gathers the sharded weights and optimizer state for a checkpoint (distributed.gather_checkpoint);
    # every process calls it, the main one gets what it writes.
    gather_checkpoint: Callable[[], tuple[dict, dict] | None] | None = None


def forward(loss_fn: torch.nn.Module, batch: Batch, device: torch.device) -> torch.Tensor:
    """The summed loss of one micro-batch (train/loss.CausalLMLoss's inputs, copied to the device)."""
    return loss_fn(
        to_device(batch.input_ids, device),
        None if batch.position_ids is None else to_device(batch.position_ids, device),
        to_device(batch.loss_index, device),
        to_device(batch.loss_targets, device),
        batch.layout,
        # Sequence-scoring objectives (train/pair_loss.py) take which sequence each target belongs to.
        **({} if batch.seqs is None else {"seqs": batch.seqs}),
    )


def eval_loss(
    loss_fn: torch.nn.Module, batches: Iterable[Batch], device: torch.device, accelerator=None
) -> tuple[float, int]:
    """(token-mean loss, loss tokens) over `batches`: no gradients, dropout off, and the loss counted as training
    counts it, the sum over every loss token divided by their number (not a mean of per-batch means).

    With several processes each passes its own share of the batches and `accelerator` sums loss and tokens.
    """
    was_training = loss_fn.training
    loss_fn.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    tokens = 0
    try:
        with torch.no_grad():
            for batch in batches:
                total += forward(loss_fn, batch, device).double()
                tokens += batch.tokens_loss
    finally:
        loss_fn.train(was_training)
    if accelerator is not None and accelerator.num_processes > 1:
        both = torch.stack([total, torch.tensor(float(tokens), dtype=torch.float64, device=device)])
        total, tokens = accelerator.reduce(both, "sum").unbind()
        tokens = int(tokens.item())
    return total.item() / max(tokens, 1), tokens


@contextmanager
def no_sync(accelerator, model: torch.nn.Module):
    """Accumulate this micro-batch's gradients without reducing them over the processes. An FSDP2 module defers
    its reduce-scatter itself; Accelerate asks it to only where it applied FSDP (not on CPU processes)."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        with accelerator.no_sync(model):
            yield
        return
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _evaluation_due(step: int, every: int, total_steps: int) -> bool:
    return step == total_steps or (every > 0 and step % every == 0)


class ThroughputMeter:
    """The loop's clocks: each log window's token rates, the steady-state window that starts after the warm-up
    steps (the rates a summary and bench report), and the run's elapsed time. Evaluation is kept out of both
    windows (`paused`): tokens/s are training's own; checkpoint saves stay in, they are part of what a run costs."""

    def __init__(self, state: TrainState, result: LoopResult, warm_until: int, padded_to_feed: int):
        self.state, self.result, self.warm_until = state, result, warm_until
        # Counted once from the batch plan (no collation): the ETA's numerator is this minus what was fed since.
        self.padded_to_feed = padded_to_feed
        self.fed_before = (state.tokens_padded, state.tokens_nonpad, state.tokens_loss)
        self.window = _Window(time.perf_counter())
        self.steady_start: float | None = None
        self.loop_start = time.perf_counter()
        self.run_start = self.loop_start - state.elapsed_s

    def add(self, padded: int, nonpad: int, loss: int) -> None:
        """One optimizer step's tokens (over all ranks)."""
        self.window.add(padded, nonpad, loss)
        if self.steady_start is not None:
            r = self.result
            r.steady_steps += 1
            r.steady_tokens_padded += padded
            r.steady_tokens_nonpad += nonpad
            r.steady_tokens_loss += loss

    @contextmanager
    def paused(self):
        start = time.perf_counter()
        yield
        spent = time.perf_counter() - start
        self.window.start += spent
        if self.steady_start is not None:
            self.steady_start += spent

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.run_start

    def steady_s(self) -> float | None:
        """Seconds of training since the warm-up ended (evaluations excluded); None before it ends."""
        return None if self.steady_start is None else time.perf_counter() - self.steady_start

    def close_window(self) -> dict[str, float]:
        """The window's token rates (per second, by kind), its per-step time kept when steady; a new window
        starts with the next call to `open_window`."""
        now = time.perf_counter()
        self.state.elapsed_s = now - self.run_start
        w = self.window
        dt = now - w.start
        if w.steady and w.steps:
            self.result.window_step_times.append(dt / w.steps)
        return {k: (v / dt if dt > 0 and w.steps else 0.0) for k, v in w.tokens().items()}

    def open_window(self) -> None:
        self.window = _Window(time.perf_counter(), steady=self.steady_start is not None)

    def eta_s(self, padded_per_s: float) -> float:
        return (self.padded_to_feed - self.state.tokens_padded) / padded_per_s if padded_per_s else 0.0

    def warmed_up(self, step: int) -> bool:
        return step == self.warm_until and self.steady_start is None

    def start_steady(self, device: torch.device) -> None:
        synchronize(device)
        self.steady_start = time.perf_counter()
        self.window = _Window(self.steady_start, steady=True)

    def finish(self, device: torch.device) -> None:
        """The run's end: its elapsed time and the steady window's; a run too short to get past the warm-up
        reports every step it ran instead."""
        synchronize(device)
        end = time.perf_counter()
        state, result = self.state, self.result
        state.elapsed_s = end - self.run_start
        if self.steady_start is not None:
            result.steady_s = end - self.steady_start
        if result.steady_steps == 0 and result.steps_run:
            result.rate_window = "all steps"
            result.steady_s, result.steady_steps = end - self.loop_start, result.steps_run
            fed = (state.tokens_padded, state.tokens_nonpad, state.tokens_loss)
            result.steady_tokens_padded, result.steady_tokens_nonpad, result.steady_tokens_loss = (
                after - before for after, before in zip(fed, self.fed_before)
            )


class HeapFreeze:
    """The loop's garbage-collection policy: the heap is frozen on entry and again once the warm-up steps are
    done (what compilation and the first steps built stays too), and unfrozen on exit unless the caller had
    frozen it already (see `freeze_heap`)."""

    def __enter__(self) -> HeapFreeze:
        self.frozen_before = gc.get_freeze_count()
        freeze_heap()
        return self

    def refreeze(self) -> None:
        freeze_heap()

    def __exit__(self, *exc) -> None:
        if not self.frozen_before:  # a caller's own freeze stays
            gc.unfreeze()


def run(ctx: LoopContext) -> LoopResult:
    """Train from `state.step` to the schedule's end (or `measure.stop_at`). `model` returns a summed loss."""
    accelerator, schedule, spec, state = ctx.accelerator, ctx.schedule, ctx.spec, ctx.state
    device, unit = accelerator.device, schedule.unit
    # Data-parallel wrappers (DDP, FSDP, DeepSpeed) average gradients over ranks; each rank's loss is scaled
    # by the world size so the average is the one-process step's sum over all ranks' tokens.
    world = accelerator.num_processes
    fit = (
        ScheduleToLimit(ctx, schedule.total_steps) if spec.run.schedule_within_limit and spec.run.max_minutes else None
    )
    end = fit.end() if fit is not None else schedule.total_steps
    stop = min(end, ctx.measure.stop_at or end)
    result = LoopResult(state=state, steps_run=0)
    padded_to_feed = schedule.padded_tokens(range(state.step, stop)) + state.tokens_padded
    # The warm-up ends with a unit of steps (BatchSource.unit), so the steady window holds whole ones.
    warm_until = state.step + math.ceil(ctx.measure.warmup_window / unit) * unit
    meter = ThroughputMeter(state, result, min(warm_until, stop), padded_to_feed)
    losses = _LossWindow(torch.zeros((), device=device))
    metrics_file = (ctx.out_dir / "metrics.jsonl").open("a") if ctx.out_dir is not None else None
    ctx.loss_fn.train()
    with HeapFreeze() as heap:
        try:
            # A fitted schedule's end moves (ScheduleToLimit): the steps are iterated to the schedule's own end, and the
            # loop breaks at `stop`.
            last = min(schedule.total_steps, ctx.measure.stop_at or schedule.total_steps) if fit else stop
            for step, batches in schedule.iterate(state.step, last):
                # Over all ranks, from the batch plan: no communication.
                padded, nonpad, step_loss_tokens = schedule.step_tokens(step)
                # The step's loss is a mean over its loss tokens (or its pairs: objectives.Objective.mean_over).
                normaliser = schedule.step_normaliser(step)
                step_lr = _optimizer_step(ctx, batches, world / float(max(normaliser, 1)), losses)
                state.step = step + 1
                result.steps_run += 1
                state.tokens_padded += padded
                state.tokens_nonpad += nonpad
                state.tokens_loss += step_loss_tokens
                losses.tokens += normaliser
                meter.add(padded, nonpad, step_loss_tokens)
                stopping = False
                # Where a unit of steps ends: the run may end, refit its schedule or save only there.
                boundary = state.step % unit == 0
                if fit is not None and meter.steady_start is not None and boundary:
                    end = fit.update(meter, world)
                    stop = min(end, ctx.measure.stop_at or end)
                    meter.padded_to_feed = schedule.padded_tokens(range(state.step, stop)) + state.tokens_padded
                if ctx.evaluation is not None and _evaluation_due(state.step, ctx.evaluation.spec.every, end):
                    with meter.paused():
                        stopping = result.stopped_early = _evaluate_step(ctx, metrics_file)
                if (
                    not stopping
                    and boundary
                    and state.step < stop
                    and out_of_time(spec.run.max_minutes, meter, result, ctx, world, unit, fit is not None)
                ):
                    stopping = result.time_limited = True
                if state.step % spec.run.log_steps == 0 or state.step == stop or stopping:
                    _log_step(ctx, metrics_file, meter, losses, step_lr, world)
                else:
                    ctx.progress.advance(state.step)
                if meter.warmed_up(state.step):  # after the log, whose window it would otherwise empty
                    heap.refreeze()
                    meter.start_steady(device)
                if ctx.measure.on_step is not None:
                    ctx.measure.on_step(state.step)
                if stopping:
                    break
                if spec.run.save_steps and state.step % spec.run.save_steps == 0 and boundary and state.step < end:
                    _save_checkpoint(ctx, meter.elapsed_s())
                if state.step >= stop:
                    break
        finally:
            if metrics_file is not None:
                metrics_file.close()
            ctx.progress.close()
    meter.finish(device)
    result.finished = state.step >= end or result.stopped_early or result.time_limited
    mem = ctx.memwatch.read()
    result.peak_memory_bytes = mem.peak_bytes
    result.peak_reserved_bytes = mem.peak_reserved_bytes
    result.peak_absolute_bytes = mem.peak_absolute_bytes
    return result


def past_limit(max_minutes: float, elapsed_s: float, next_s: float) -> bool:
    """Whether work of `next_s` more seconds, after `elapsed_s` of training, would end past `max_minutes` (0: never)."""
    return max_minutes > 0 and elapsed_s + next_s > max_minutes * 60


def out_of_time(
    max_minutes: float,
    meter: ThroughputMeter,
    result: LoopResult,
    ctx: LoopContext,
    world: int,
    unit: int = 1,
    fitted: bool = False,
) -> bool:
    """Whether one more unit of steps (BatchSource.unit), at the mean step time since this process started its loop,
    would end past `max_minutes` of training (over every resume: the meter counts the checkpoint's elapsed time). Under several
    processes the main one decides and all follow: one small reduction per step, paid only by a run that sets a
    limit."""
    if max_minutes <= 0:
        return False
    loop_s = time.perf_counter() - meter.loop_start
    step_s = loop_s / max(result.steps_run, 1)
    steady = meter.steady_s()
    if fitted and steady is not None and result.steady_steps:
        # A schedule fitted to the limit (ScheduleToLimit) is fitted on the pace since the warm-up: the check takes the same
        # pace, or a slow warm-up (compilation) would end the run a step before the end the fit chose.
        step_s = steady / result.steady_steps
    late = past_limit(max_minutes, meter.elapsed_s(), step_s * unit)
    if world == 1:
        return late
    flag = torch.tensor(float(late and ctx.accelerator.is_main_process), device=ctx.accelerator.device)
    return ctx.accelerator.reduce(flag, "sum").item() > 0


@dataclass
class _LossWindow:
    """The summed training loss and its token count since the last log line (summed on the device: no sync)."""

    total: torch.Tensor
    tokens: int = 0


def _optimizer_step(ctx: LoopContext, batches: list[Batch], scale: float, losses: _LossWindow) -> float:
    """Accumulate the step's micro-batches, clip, step; returns the learning rate the step trained at."""
    accelerator, loss_fn, optimizer, scheduler = ctx.accelerator, ctx.loss_fn, ctx.optimizer, ctx.scheduler
    feed = ctx.schedule.forward or forward  # looked up per step: tests and probes replace `forward`
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        # Accumulation boundary for DeepSpeed, whose engine steps inside `backward` when it is set.
        accelerator.sync_gradients = last
        with nullcontext() if last else no_sync(accelerator, loss_fn):
            loss_sum = feed(loss_fn, batch, accelerator.device)
            # Normalise by the step's loss tokens, not per micro-batch: packed micro-batches hold
            # different numbers of targets, and a per-micro-batch mean would weight them unequally.
            accelerator.backward(loss_sum * scale)
        losses.total += loss_sum.detach()
    # DeepSpeed clips inside its own step (train/distributed.prepare_deepspeed gives it max_grad_norm);
    # Accelerate's clip would only read its norm back, a host sync every step.
    if ctx.optim.max_grad_norm > 0 and accelerator.distributed_type != "DEEPSPEED":
        accelerator.clip_grad_norm_(loss_fn.parameters(), ctx.optim.max_grad_norm)
    step_lr = scheduler.get_last_lr()[0]  # the rate this step trains at; scheduler.step() sets the next one
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return step_lr


def _log_step(ctx: LoopContext, metrics_file, meter: ThroughputMeter, losses: _LossWindow, lr: float, world: int):
    """The log line at `state.step`: the window's mean loss (the one host sync per log window), rates, memory."""
    state = ctx.state
    summed = ctx.accelerator.reduce(losses.total, "sum") if world > 1 else losses.total
    loss = summed.item() / max(losses.tokens, 1)
    per_s = meter.close_window()
    mem = ctx.memwatch.read()
    eta = meter.eta_s(per_s["tokens_padded"])
    record = {
        "step": state.step,
        # The run's length and its token-based ETA, as the progress line shows them: a reader of the file
        # (`tunelab ui`) shows how far a running run is without rebuilding its schedule.
        "total_steps": state.schedule_steps or ctx.schedule.total_steps,
        "eta_s": eta,
        "loss": loss,
        "lr": lr,
        "tokens_padded": state.tokens_padded,
        "tokens_nonpad": state.tokens_nonpad,
        "tokens_loss": state.tokens_loss,
        "elapsed_s": state.elapsed_s,
        **{f"{k}_per_s": v for k, v in per_s.items()},
        "peak_memory_bytes": mem.peak_bytes,
    }
    # Objectives that log more than the loss (preference rewards, log-probs) keep their own window of it.
    window_metrics = getattr(ctx.accelerator.unwrap_model(ctx.loss_fn), "window_metrics", None)
    if window_metrics is not None:
        record.update(window_metrics(ctx.accelerator if world > 1 else None))
    record.update(ctx.schedule.window_metrics())  # a generating source's (rewards, completions, generation time)
    meter.result.losses.append((state.step, loss))
    _record(ctx, metrics_file, record)
    ctx.progress.update(
        LogLine(
            state.step,
            state.schedule_steps or ctx.schedule.total_steps,
            loss,
            lr,
            per_s["tokens_nonpad"],
            mem.peak_bytes,
            eta,
        )
    )
    losses.total.zero_()
    losses.tokens = 0
    meter.open_window()


def _save_checkpoint(ctx: LoopContext, elapsed_s: float) -> None:
    """A checkpoint of the run at `ctx.state.step`, written by the main process. Under FSDP every process first
    takes part in gathering it, and the others then wait until it is on disk: should the write fail, the main
    process ends and the launcher stops the rest (the process group's timeout bounds the wait otherwise)."""
    ctx.state.elapsed_s = elapsed_s
    gathered = ctx.gather_checkpoint() if ctx.gather_checkpoint is not None else None
    if ctx.out_dir is not None:
        # Checkpoint time stays inside the timing windows: it is part of what the run costs.
        checkpoint.save(
            ctx.out_dir / "checkpoints",
            ctx.accelerator.unwrap_model(ctx.loss_fn).model,
            ctx.optimizer,
            ctx.scheduler,
            ctx.state,
            ctx.spec.run.save_total_limit,
            ctx.spec.identity,
            best=ctx.evaluation.best_dir if ctx.evaluation is not None else None,
            gathered=gathered,
        )
    if ctx.gather_checkpoint is not None:
        ctx.accelerator.wait_for_everyone()


def freeze_heap() -> None:
    """Move every object alive now (model, optimizer, libraries, compiled graphs) out of the garbage
    collector's reach, after one full collection. Python's full collections scan the whole heap, a quarter of
    a second per collection with the embedded model loaded, stalling whichever step they land in
    (benchmarks/design-decisions_cpu_2026-11-22.md#heap-frozen-for-the-loop); frozen, they scan only
    what the steps themselves create. Young collections still free each step's cyclic garbage."""
    gc.collect()
    gc.freeze()


def _record(ctx: LoopContext, metrics_file, record: dict) -> None:
    """One metrics.jsonl line, and the same values at the same step for the trackers."""
    if metrics_file is not None:
        metrics_file.write(json.dumps(record) + "\n")
        metrics_file.flush()
    if ctx.track:
        ctx.accelerator.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])


def _evaluate_step(ctx: LoopContext, metrics_file) -> bool:
    """Evaluate at `state.step`: record it, keep the best, and say whether early stopping ends the run now."""
    ev, state, device = ctx.evaluation, ctx.state, ctx.accelerator.device
    synchronize(device)
    start = time.perf_counter()
    loss, tokens = eval_loss(ctx.loss_fn, ev.batches, device, ctx.accelerator)
    seconds = time.perf_counter() - start
    state.evaluations += 1
    state.eval_s += seconds
    improved = state.best_eval_loss is None or loss < state.best_eval_loss
    if improved:
        state.best_step, state.best_eval_loss, state.evals_since_best = state.step, loss, 0
    else:
        state.evals_since_best += 1
    record = {"step": state.step, "eval_loss": loss, "eval_tokens": tokens, "eval_s": seconds}
    _record(ctx, metrics_file, record)
    ctx.progress.note(
        f"step {state.step}/{ctx.schedule.total_steps} | eval loss {loss:.4f} ({tokens:,} tokens, {seconds:.1f} s)"
        + (" | best so far" if improved else f" | best {state.best_eval_loss:.4f} at step {state.best_step}")
    )
    if improved and ev.save_best is not None:
        ev.save_best(state)
    patience = ev.spec.patience
    if patience is not None and state.evals_since_best >= patience and state.step < ctx.schedule.total_steps:
        ctx.progress.note(
            f"early stopping at step {state.step}: {state.evals_since_best} evaluations without a lower eval loss "
            f"than {state.best_eval_loss:.4f} (step {state.best_step})"
        )
        return True
    return False
