"""`tunelab train` for objective grpo: each generation batch is prompts x G completions sampled from the policy
(eval/sampling.py), scored by the rewards (train/rewards.py), turned into group-normalised advantages, scored under
the policy at generation (num_iterations > 1) and the reference (beta > 0), then `num_iterations` optimizer steps
on it (train/grpo.py). One process; metrics.jsonl as TRL names them; completions.jsonl every
grpo.log_completions_steps; checkpoints every save_steps hold the weights, optimizer, scheduler and the RNG the
sampler draws from (torch's global generator), so a resumed run samples what the uninterrupted one would.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .. import allocator, objectives, sources
from ..config import TrainConfig
from ..data.pipeline import prepare
from ..data.prompts import PromptData
from ..device import device_memory_bytes, device_name, library_versions, pick_device, pick_precision
from ..errors import TunelabError
from ..eval.generate import stops
from ..eval.sampling import sample
from ..memwatch import MemoryWatch
from ..model import load as mload
from ..model.adapters import apply_adapter, count_parameters
from ..model.lora_linear import nf4_layers, pack_for_inference
from ..train import checkpoint, rewards, trackers
from ..train.checkpoint import TrainState
from ..train.distributed import local_numel
from ..train.grpo import GrpoLoss, Rollout, advantages, trains_on
from ..train.loop import LoopResult, Measurement, build_scheduler, fitted_schedule_steps, past_limit
from ..train.optim import build_optimizer
from ..train.pair_loss import loss_module
from . import outputs
from .summary import RunSummary

COMPLETIONS = "completions.jsonl"  # sampled completions, every grpo.log_completions_steps
COMPLETIONS_LOGGED = 4  # completions per logged step in completions.jsonl
CLIP_METRICS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")
# grpo.schedule_within_limit fits the schedule after the first generation batch, and again after every batch from
# this one on, on the pace of the last PACE_WINDOW batches after the first (whose time holds the run's warm-up: 49 s
# against 40 s later on a 2-core Zen 3). A trailing pace follows batches that slow down as a run goes on (25-26 s at
# first and 37-39 s at the end of one run on a 2-core Zen 3, whose fit on batches 2-3 held 9 batches too many).
REFIT_BATCH = 3
PACE_WINDOW = 3
# A refit prints its `schedule:` line only where the end moved by this share of the end last printed: refitted
# after every batch, the end wanders a step or two with each batch's pace (17 lines in one 31-step run on a 2-core
# Zen 3), and the progress lines' `step N/TOTAL` already shows where it stands.
SCHEDULE_SHOWN_MOVE = 0.1


@dataclass
class GrpoRun:
    cfg: TrainConfig
    out: Path
    device: torch.device
    dtype: torch.dtype
    tokenizer: object
    prompts: PromptData
    rewards: list
    root: GrpoLoss
    optimizer: object
    scheduler: object
    total_steps: int
    stop_ids: tuple[int, ...]
    pad_id: int
    strata: list | None = None  # each prompt's value of grpo.balance_by
    precision_name: str = "fp32"  # device.Precision.name, as the summary reports it
    shown_steps: int | None = None  # the schedule's end this process last printed
    state: TrainState = field(default_factory=TrainState)


def steps_for(cfg: TrainConfig, prompts: int) -> int:
    """Optimizer steps: max_steps, else epochs over the prompts, `micro_batch x grad_accum` prompts per generation
    batch and `num_iterations` steps on each."""
    if cfg.batch.max_steps is not None:
        return cfg.batch.max_steps
    per_batch = cfg.batch.micro_batch * cfg.batch.grad_accum
    return max(1, math.ceil(cfg.batch.epochs * prompts / per_batch)) * cfg.objective.grpo.num_iterations


def prompt_order(count: int, batch: int, generation: int, seed: int, strata: list | None = None) -> list[int]:
    """The prompt indices of generation batch `generation`: each epoch a fresh permutation drawn from `seed`,
    balanced over `strata` (each prompt's value of grpo.balance_by) when given."""
    per_epoch = max(1, count // batch)
    epoch, k = divmod(generation, per_epoch)
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(count) if strata is None else balanced_permutation(strata, rng)
    return order[k * batch : (k + 1) * batch].tolist()


def balanced_permutation(strata: list, rng: np.random.Generator) -> np.ndarray:
    """A permutation in which every run of consecutive prompts holds each stratum in proportion to its size: the
    i-th of a stratum's n prompts (in a random order) sits at (i + u) / n, u one random offset per stratum, and the
    prompts are sorted by that place (systematic sampling within each stratum)."""
    keys = np.empty(len(strata))
    groups: dict = {}
    for i, value in enumerate(strata):
        groups.setdefault(value, []).append(i)
    for members in groups.values():
        members = rng.permutation(members)
        keys[members] = (np.arange(len(members)) + rng.random()) / len(members)
    return np.argsort(keys, kind="stable")


def setup(cfg: TrainConfig, out: Path) -> GrpoRun:
    settings = cfg.objective.grpo
    loaded = rewards.load_all(settings.rewards)  # a missing file or function fails before the model loads
    device = pick_device(cfg.compute.device)
    if device.type == "cpu":
        # Rollouts change shape every batch, so freed pages are not reused: they are freed lazily (allocator.DECAY_MS)
        # and never returned for good. Returning them (RETURN_MS) made the quickstart's run 16-29% slower in page
        # faults (benchmarks/design-decisions_cpu_2026-11-28.md#grpo-frees-pages-lazily-only).
        allocator.decay_freed_pages(allocator.DECAY_MS, returned_ms=-1)
    precision = pick_precision(cfg.compute.precision, device)
    source = sources.resolve(cfg.model, cfg.trust_remote_code)
    if not cfg.data.given:
        raise TunelabError(
            "data.path is not set; point it at a file of prompt rows (tunelab data arithmetic --prompts)"
        )
    tokenizer = sources.load_tokenizer(source)
    prompts = prepare(cfg.data_specs()[0], tokenizer)
    strata = balance_values(prompts, settings.balance_by, cfg.data.path)
    torch.manual_seed(cfg.run.seed)
    model = mload.load_model(source, precision.compute, cfg.adapter.quant, device, attn="sdpa")
    model = apply_adapter(model, cfg.adapter)
    # Sampling and the scoring passes run without autograd: over [W | sB] packed once, not concatenated per call.
    pack_for_inference(model)
    root = loss_module(model, cfg.objective, cfg.adapter.row.trains_base)  # the objective row's loss_module
    optimizer = build_optimizer(model, cfg.optimizer, device)
    total = steps_for(cfg, len(prompts))
    stop = stops(model, tokenizer, cfg.data.format)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop.ids[0]
    return GrpoRun(
        cfg,
        out,
        device,
        precision.compute,
        tokenizer,
        prompts,
        loaded,
        root,
        optimizer,
        build_scheduler(optimizer, cfg.optimizer, total),
        total,
        stop.ids,
        pad,
        strata,
        precision_name=precision.name,
    )


def balance_values(prompts: PromptData, key: str | None, path: str) -> list | None:
    """Each prompt's value of grpo.balance_by, checked before the model loads; None when not set."""
    if key is None:
        return None
    values = []
    for n, row in enumerate(prompts.rows, start=1):
        value = row.get(key)
        if value is None or not isinstance(value, (str, int, float, bool)):
            raise TunelabError(
                f"{path}: prompt {n} has no {key!r} to balance by (grpo.balance_by); give every row a value "
                f"(a string or number), or unset grpo.balance_by"
            )
        values.append(value)
    return values


def generate_batch(run: GrpoRun, generation: int) -> dict:
    """One generation batch: completions, rewards, advantages, rollouts, old and reference log-probs."""
    cfg, settings = run.cfg, run.cfg.objective.grpo
    group = settings.num_generations
    chosen = prompt_order(
        len(run.prompts), cfg.batch.micro_batch * cfg.batch.grad_accum, generation, cfg.run.seed, run.strata
    )
    ids = [run.prompts.ids[i] for i in chosen for _ in range(group)]
    t0 = time.perf_counter()
    with _autocast(run):
        samples = sample(
            run.root.model,
            ids,
            settings.max_completion_length,
            run.stop_ids,
            run.pad_id,
            settings.temperature,
            settings.top_p,
            decode=settings.decode,
        )
    generation_s = time.perf_counter() - t0
    texts = run.tokenizer.batch_decode(samples.ids, skip_special_tokens=True)
    rows = [run.prompts.rows[i] for i in chosen for _ in range(group)]
    per_func = rewards.score(
        run.rewards,
        [run.prompts.texts[i] for i in chosen for _ in range(group)],
        texts,
        samples.ids,
        rows,
        [i + 1 for i in chosen for _ in range(group)],
    )
    weights = torch.tensor([r.weight for r in run.rewards], dtype=torch.float32)
    adv = advantages(per_func, weights, group, settings.scale_rewards)
    keep = trains_on(adv.advantages, settings).tolist()
    per_micro = cfg.batch.micro_batch * group
    micro = []
    for start in range(0, len(ids), per_micro):
        part = slice(start, start + per_micro)
        rollout = Rollout.build(ids[part], samples.ids[part], run.pad_id, keep[part]).to(run.device)
        if rollout.rows == 0:  # no completion here carries a gradient
            micro.append((rollout, None, None, None))
            continue
        with torch.no_grad(), _autocast(run):
            old = run.root.score(rollout).logps if settings.num_iterations > 1 else None
            ref = run.root.score(rollout, reference=True).logps if settings.beta > 0 else None
        micro.append((rollout, old, ref, adv.advantages[part].to(run.device)[rollout.seq]))
    return {
        "micro": micro,
        "samples": samples,
        "texts": texts,
        "per_func": per_func,
        "adv": adv,
        "prompts": [run.prompts.texts[i] for i in chosen for _ in range(group)],
        "generation_s": generation_s,
        "sequence_tokens": sum(len(p) + len(c) for p, c in zip(ids, samples.ids)),
    }


def update(run: GrpoRun, batch: dict) -> dict:
    """One optimizer step on the generation batch: the micro-batches' losses, clipped, stepped. Micro-batches
    without a completion that carries a gradient are not run; a step where none does is still taken, on zero
    gradients (AdamW's moments and weight decay move the weights as TRL's step would)."""
    micro = batch["micro"]
    step_tokens = sum(m[0].tokens for m in micro)
    sums: dict[str, float] = {"tokens": 0.0, **dict.fromkeys(CLIP_METRICS, 0.0)}
    total = 0.0
    for rollout, old, ref, adv in micro:
        if rollout.rows == 0:
            continue
        with _autocast(run):
            out = run.root(rollout, old, ref, adv, micro_batches=len(micro), step_tokens=step_tokens)
        out.loss.backward()
        total += out.loss.item()
        for k, v in out.metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    trained = [p for p in run.root.parameters() if p.requires_grad]
    for p in trained:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    max_norm = run.cfg.optimizer.max_grad_norm
    if max_norm > 0:
        torch.nn.utils.clip_grad_norm_(trained, max_norm)
    lr = run.scheduler.get_last_lr()[0]
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    # Clip ratios over every completion token (a left-out completion has none clipped), as TRL's; entropy and KL
    # over the tokens the update ran.
    ran = max(sums.pop("tokens"), 1.0)
    return {
        "loss": total,
        "lr": lr,
        # Not TRL's: how many of the batch's completions the update ran (plan's signal share, `--from-run`).
        "update_completions": sum(m[0].rows for m in micro),
        "completions_per_batch": sum(m[0].sequences for m in micro),
        **{k: v / (max(step_tokens, 1) if k in CLIP_METRICS else ran) for k, v in sums.items()},
    }


def batch_metrics(run: GrpoRun, batch: dict) -> dict:
    """The generation batch's metrics as TRL names them."""
    samples, adv, per_func = batch["samples"], batch["adv"], batch["per_func"]
    lengths = torch.tensor([len(c) for c in samples.ids], dtype=torch.float32)
    clipped = torch.tensor(samples.clipped)
    done = lengths[~clipped]
    out = {
        "reward": torch.nanmean(adv.rewards).item(),
        "reward_std": _std(adv.rewards),
        "frac_reward_zero_std": adv.zero_std.float().mean().item(),
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": clipped.float().mean().item(),
        "completions/mean_terminated_length": done.mean().item() if len(done) else 0.0,
    }
    for j, reward in enumerate(run.rewards):
        out[f"rewards/{reward.name}/mean"] = torch.nanmean(per_func[:, j]).item()
        out[f"rewards/{reward.name}/std"] = _std(per_func[:, j])
    return out


def _std(x: torch.Tensor) -> float:
    from ..train.grpo import nanstd

    value = nanstd(x).item()
    return 0.0 if math.isnan(value) else value


def _autocast(run: GrpoRun):
    return torch.autocast(run.device.type, dtype=run.dtype, enabled=run.dtype != torch.float32)


def train(cfg: TrainConfig, show_progress: bool = True, measure: Measurement | None = None) -> RunSummary:
    """The recipe of objective grpo (objectives.Objective.recipe): run a GRPO job and return its summary (also
    written to output_dir/summary.json). `measure`: what a measuring caller asks of the run (stop before the
    schedule's end, the steps kept out of the summary's rates, a per-step callback)."""
    refusal = objectives.lacking(cfg.objective.row, "processes", "run it without --nproc")
    if refusal and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise TunelabError(refusal)
    trackers.check_available(cfg.run.report_to)
    out = Path(cfg.run.output_dir)
    with outputs.held(out):
        summary = _train_locked(cfg, out, show_progress, measure or Measurement())
        outputs.write_summary(out, summary.as_dict())
    return summary


@dataclass
class Tally:
    """What this process's steps leave for the summary: each step's seconds and tokens (padded, non-padding, with
    loss), the first and the last logged record, whether max_minutes ended the run."""

    steps: list[tuple[float, int, int, int]] = field(default_factory=list)
    first_loss: float | None = None
    last: dict = field(default_factory=dict)
    time_limited: bool = False


def _train_locked(cfg: TrainConfig, out: Path, show_progress: bool, measure: Measurement) -> RunSummary:
    t0 = time.perf_counter()
    run = setup(cfg, out)
    found = checkpoint.find(out / "checkpoints", cfg.run.resume) if cfg.run.resume else None
    if found is not None:
        run.state = checkpoint.load(found, run.root, run.optimizer, run.scheduler)
        if run.state.schedule_steps is not None:  # the schedule the run had fitted to its time limit
            reschedule(run, run.state.schedule_steps)
    first_loss = outputs.start_logs(cfg, out, found, run.state.step, show_progress, logs=(COMPLETIONS,))
    memwatch = MemoryWatch(run.device)
    tally = Tally(first_loss=first_loss)
    setup_ = trackers.setup(cfg.run.report_to, out, run.state.step)
    accelerator = None if setup_ is None else logging_accelerator(run)
    with outputs.tracking(accelerator, setup_, cfg, show_progress) as track, (out / outputs.METRICS).open("a") as f:
        fit(run, memwatch, tally, Log(f, accelerator if track else None), show_progress, measure)
    if tally.time_limited and show_progress:
        outputs.say_time_limited(cfg.run.max_minutes, run.state.step, run.total_steps)
    outputs.save_final(run.root.model, run.tokenizer, out, cfg.adapter.method)
    return summarize(run, tally, memwatch.read(), measure.warmup_window, time.perf_counter() - t0)


def logging_accelerator(run: GrpoRun):
    """An Accelerator that only logs: the tracker `report_to` names writes under output_dir (the run's own steps
    place and cast nothing through it)."""
    from accelerate import Accelerator

    report_to = run.cfg.run.report_to
    return Accelerator(cpu=run.device.type == "cpu", log_with=report_to, project_dir=str(run.out))


@dataclass
class Log:
    """Where a logged step's record goes: metrics.jsonl, and the tracker (an Accelerator's) when one is on, under
    the same names at the same step."""

    file: object
    tracker: object = None

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.tracker is not None:
            self.tracker.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])


def fit(run: GrpoRun, memwatch: MemoryWatch, tally: Tally, log: Log, show_progress: bool, measure) -> None:
    """The steps: a generation batch every num_iterations steps, an update each; logs, the time limit and the
    schedule fitted to it, checkpoints between generation batches."""
    cfg, out, settings = run.cfg, run.out, run.cfg.objective.grpo
    batch = None
    start_s, start_step = run.state.elapsed_s, run.state.step  # where this process took over (0, or a resume)
    ends = [start_s]  # the elapsed time at the end of each of this process's generation batches
    stop_at = run.total_steps if measure.stop_at is None else measure.stop_at
    while run.state.step < min(run.total_steps, stop_at) and not tally.time_limited:
        step_t0 = time.perf_counter()
        iteration = run.state.step % settings.num_iterations
        if batch is None or iteration == 0:
            batch = generate_batch(run, run.state.step // settings.num_iterations)
        record = {"step": run.state.step + 1, **update(run, batch), **batch_metrics(run, batch)}
        run.state.step += 1
        padded, nonpad, loss = batch_tokens(batch)
        run.state.tokens_padded += padded
        run.state.tokens_nonpad += nonpad
        run.state.tokens_loss += loss
        step_s = time.perf_counter() - step_t0
        run.state.elapsed_s += step_s
        tally.steps.append((step_s, padded, nonpad, loss))
        record.update(
            generation_s=batch["generation_s"] if iteration == 0 else 0.0,
            elapsed_s=run.state.elapsed_s,
            peak_memory_bytes=memwatch.read().peak_bytes,
        )
        tally.last = record
        if tally.first_loss is None:
            tally.first_loss = record["loss"]
        # Only between generation batches, as checkpoints: the next batch's generation and its updates.
        boundary = run.state.step % settings.num_iterations == 0
        batches = (run.state.step - start_step) // settings.num_iterations if boundary else 0
        if batches:
            ends.append(run.state.elapsed_s)
            # A resumed process keeps its checkpoint's schedule, as the uninterrupted run had it then.
            if batches == 1 or (batches >= REFIT_BATCH and start_step == 0):
                fit_schedule(run, trailing_pace(ends), show_progress, refit=batches > 1)
        tally.time_limited = (
            boundary
            and run.state.step < run.total_steps
            and past_limit(cfg.run.max_minutes, run.state.elapsed_s, trailing_pace(ends))
        )
        if run.state.step % cfg.run.log_steps == 0 or run.state.step == run.total_steps or tally.time_limited:
            log.write(record)
            if show_progress:
                print(_progress_line(run, record), flush=True)
        every = settings.log_completions_steps
        if every and run.state.step % every == 0 and iteration == 0:
            _log_completions(out, run.state.step, batch)
        # Only between generation batches: a resume then samples the next batch from the restored RNG.
        if (
            cfg.run.save_steps
            and run.state.step % cfg.run.save_steps == 0
            and boundary
            and run.state.step < run.total_steps
        ):
            checkpoint.save(
                out / "checkpoints", run.root, run.optimizer, run.scheduler, run.state, cfg.run.save_total_limit
            )
        if measure.on_step is not None:
            measure.on_step(run.state.step)


def batch_tokens(batch: dict) -> tuple[int, int, int]:
    """One update's tokens: padded (the rows it ran, padding included), non-padding (the generation batch's prompts
    and completions) and with loss (the completions' tokens)."""
    micro = batch["micro"]
    padded = sum(m[0].input_ids.numel() for m in micro)
    return padded, batch["sequence_tokens"], sum(m[0].tokens for m in micro)


def summarize(run: GrpoRun, tally: Tally, memory, warmup: int, total_s: float) -> RunSummary:
    """The run's summary, in the record every objective's recipe returns."""
    cfg, state = run.cfg, run.state
    trainable, total = count_parameters(run.root.model)
    finished = state.step >= run.total_steps or tally.time_limited
    return RunSummary(
        output_dir=str(run.out),
        model=cfg.model,
        method=cfg.adapter.method,
        objective=cfg.objective.name,
        base_quant=cfg.adapter.quant,
        nf4_layers=nf4_layers(run.root.model),
        device=device_name(run.device),
        device_memory_bytes=device_memory_bytes(run.device),
        precision=run.precision_name,
        params_trainable=trainable,
        params_total=total,
        params_local=local_numel(run.root),
        seq_len=cfg.batch.seq_len,
        micro_batch=cfg.batch.micro_batch,
        grad_accum=cfg.batch.grad_accum,
        packing=False,  # rollouts are right-padded rows
        grad_ckpt=cfg.compute.grad_ckpt,
        compile=None,
        activation_offload=cfg.compute.activation_offload,
        world_size=1,
        # What the model was trained to write at most: `tunelab eval` caps its generation there (plus slack).
        data={
            "prompts": len(run.prompts),
            "prompts_dropped": run.prompts.dropped,
            "response_tokens_max": cfg.objective.grpo.max_completion_length,
        },
        steps=state.step,
        total_steps=run.total_steps,
        schedule_steps=run.state.schedule_steps,
        finished=finished,
        early_stopped=False,
        time_limited=tally.time_limited,
        loss_first=tally.first_loss,
        loss_last=tally.last.get("loss"),
        tokens_padded=state.tokens_padded,
        tokens_nonpad=state.tokens_nonpad,
        tokens_loss=state.tokens_loss,
        **rates(tally.steps, warmup),
        reward_last=tally.last.get("reward"),
        peak_memory_bytes=memory.peak_bytes,
        peak_memory_reserved_bytes=memory.peak_reserved_bytes,
        peak_memory_absolute_bytes=memory.peak_absolute_bytes,
        train_s=state.elapsed_s,
        elapsed_s=total_s,
        versions=library_versions(),
    )


def rates(steps: list[tuple[float, int, int, int]], warmup: int) -> dict:
    """The summary's rates as the loop's (train/loop.LoopResult.rates): over the steps after the first `warmup`
    of this process, generation included, or over every step of a run too short to have any."""
    window, name = (steps[warmup:], "steady") if len(steps) > warmup else (steps, "all steps")
    seconds = [s for s, *_ in window]
    result = LoopResult(
        state=TrainState(),
        steps_run=len(steps),
        steady_s=sum(seconds),
        steady_steps=len(window),
        steady_tokens_padded=sum(p for _, p, _, _ in window),
        steady_tokens_nonpad=sum(n for _, _, n, _ in window),
        steady_tokens_loss=sum(k for _, _, _, k in window),
        rate_window=name,
        window_step_times=seconds,
    )
    return result.rates()


def trailing_pace(ends: list[float]) -> float:
    """Seconds a generation batch, from `ends` (the elapsed time at this process's start and after each of its
    batches): over the last PACE_WINDOW batches after the first, whose time holds the warm-up, once there are any."""
    done = len(ends) - 1
    if done <= 1:
        return ends[-1] - ends[0]
    window = min(PACE_WINDOW, done - 1)
    return (ends[-1] - ends[-1 - window]) / window


def fit_schedule(run: GrpoRun, batch_s: float, show_progress: bool, refit: bool = False) -> None:
    """grpo.schedule_within_limit, after this process's first generation batch and again (`refit`) after each from
    its REFIT_BATCH-th on: where the batches that `batch_s` (seconds a batch) says fit max_minutes end before the
    config's schedule does, the run and its learning-rate schedule end there. The first batch holds the run's
    warm-up, so the first fit is short; the refits, on batches without it, lengthen the schedule again, or shorten
    it when batches slow down. A resume keeps the fitted schedule."""
    cfg, state = run.cfg, run.state
    per_batch = cfg.objective.grpo.num_iterations
    if not cfg.objective.grpo.schedule_within_limit or (state.schedule_steps is not None and not refit):
        return
    full = steps_for(cfg, len(run.prompts))
    steps = fitted_schedule_steps(cfg.run.max_minutes, state.elapsed_s, state.step, batch_s, per_batch)
    steps = min(max(steps, state.step), full)
    if steps == run.total_steps:
        return
    if show_progress and (
        run.shown_steps is None or abs(steps - run.shown_steps) >= SCHEDULE_SHOWN_MOVE * run.shown_steps
    ):
        print(
            f"schedule: at {batch_s:.0f} s a generation batch, max_minutes {cfg.run.max_minutes:g} holds {steps} of "
            f"the {full} steps; the learning-rate schedule now ends at step {steps}",
            flush=True,
        )
        run.shown_steps = steps
    state.schedule_steps = steps
    reschedule(run, steps)


def reschedule(run: GrpoRun, steps: int) -> None:
    """The run ends at `steps`, its learning-rate schedule decaying over them from where it stands."""
    run.total_steps = steps
    run.scheduler = build_scheduler(run.optimizer, run.cfg.optimizer, steps, at_step=run.state.step)


def _progress_line(run: GrpoRun, r: dict) -> str:
    return (
        f"step {r['step']}/{run.total_steps}  reward {r['reward']:.3f}  loss {r['loss']:.4f}  "
        f"length {r['completions/mean_length']:.1f}  clipped {r['completions/clipped_ratio']:.2f}  "
        f"{r['elapsed_s']:.0f}s"
    )


def _log_completions(out: Path, step: int, batch: dict) -> None:
    rows = [
        {"step": step, "prompt": p, "completion": c, "reward": float(r), "advantage": float(a)}
        for p, c, r, a in zip(batch["prompts"], batch["texts"], batch["adv"].rewards, batch["adv"].advantages)
    ][:COMPLETIONS_LOGGED]
    with (out / COMPLETIONS).open("a") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
