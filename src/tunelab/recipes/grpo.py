"""`tunelab train` for objective grpo: GRPO as a batch source for the shared loop (train/loop.run), as TRL's
GRPOTrainer overrides only the Trainer's input preparation and loss. Every num_iterations steps the source samples a
generation batch, prompts x G completions from the policy (eval/sampling.py), scores it with the rewards
(train/rewards.py), turns them into group-normalised advantages and scores the completions under the policy at
generation (num_iterations > 1) and the reference (beta > 0); each step then runs the loop's micro-step,
accumulation, clipping, optimizer, schedule (run.schedule_within_limit's ScheduleToLimit included), checkpoints, metrics
and trackers, SFT's own, on the loss of train/grpo.py. metrics.jsonl as TRL names them; completions.jsonl every
grpo.log_completions_steps; checkpoints fall between generation batches and hold the RNG the sampler draws from
(torch's global generator), so a resumed run samples what the uninterrupted one would.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from .. import allocator, objectives, sources
from ..config import TrainConfig
from ..data.pipeline import prepare
from ..data.prompts import PromptData
from ..device import pick_device, pick_precision
from ..errors import TunelabError
from ..eval.generate import stops
from ..eval.sampling import sample
from ..memwatch import MemoryWatch
from ..model import load as mload
from ..model import offload
from ..model.adapters import apply_adapter
from ..model.lora_linear import pack_for_inference
from ..runtime import compile_choice
from ..train import checkpoint, distributed, loop, rewards, trackers
from ..train.checkpoint import TrainState
from ..train.grpo import GrpoLoss, Rollout, advantages, nanstd, trains_on
from ..train.loop import LoopResult, Measurement
from ..train.progress import ProgressView
from . import outputs
from .finetune import Prepared, compile_blocks, make_accelerator, weights_identity
from .strategy import Strategy, Trainee, pick_strategy
from .summary import RunSummary

COMPLETIONS = "completions.jsonl"  # sampled completions, every grpo.log_completions_steps
COMPLETIONS_LOGGED = 4  # completions per logged step in completions.jsonl
CLIP_METRICS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")


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


@dataclass
class Micro:
    """One micro-batch of a generated batch: its rollout, the log-probs at generation (num_iterations > 1) and under
    the reference (beta > 0), each token's completion's advantage."""

    rollout: Rollout
    old: torch.Tensor | None = None
    ref: torch.Tensor | None = None
    adv: torch.Tensor | None = None


@dataclass
class Generated:
    """One generation batch: completions, rewards, advantages, the micro-batches the update runs."""

    micro: list[Micro]
    samples: object  # eval/sampling.Samples
    texts: list[str]
    per_func: torch.Tensor
    adv: object  # train/grpo.Advantages
    prompts: list[str]
    generation_s: float
    sequence_tokens: int
    metrics: dict = field(default_factory=dict)  # batch_metrics: TRL's names

    @property
    def step_tokens(self) -> int:
        """The step's completion tokens, the left-out completions' included (dapo's denominator)."""
        return sum(m.rollout.tokens for m in self.micro)

    def tokens(self) -> tuple[int, int, int]:
        """One update's tokens: padded (the rows it ran, padding included), non-padding (the batch's prompts and
        completions) and with loss (the completions' tokens)."""
        padded = sum(m.rollout.input_ids.numel() for m in self.micro)
        return padded, self.sequence_tokens, self.step_tokens


class GrpoSource:
    """GRPO as the shared loop's batch source (train/batches.BatchSource): every num_iterations steps it samples a
    generation batch from the policy, scores its rewards, advantages and the old and reference log-probs (without
    autograd, dropout off), and each step then hands the loop that batch's micro-batches; the loop's micro-step,
    accumulation, clipping, optimizer, schedule, checkpoints and logs are SFT's."""

    def __init__(self, cfg: TrainConfig, prompts: PromptData, tokenizer, strata: list | None, total_steps: int):
        self.cfg, self.settings, self.prompts, self.tokenizer, self.strata = (
            cfg,
            cfg.objective.grpo,
            prompts,
            tokenizer,
            strata,
        )
        self.total_steps = total_steps
        self.unit = self.settings.num_iterations  # a checkpoint between a batch's updates could not resume it
        self.rewards: list = []
        self.root: GrpoLoss | None = None  # set once the model is built
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.stop_ids: tuple[int, ...] = ()
        self.pad_id = 0
        self.out: Path | None = None  # completions.jsonl goes here (the main process)
        self.batch: Generated | None = None
        self.step_seen = 0  # updates since the last log line, and what they summed (train/grpo.TokenLoss.metrics)
        self.sums: dict[str, torch.Tensor] = {}
        self.generation_s = 0.0
        self.last_logged: dict = {}

    def generate(self, generation: int) -> Generated:
        """Generation batch `generation`: completions, rewards, advantages, rollouts, old and reference log-probs."""
        cfg, settings, group = self.cfg, self.settings, self.settings.num_generations
        chosen = prompt_order(
            len(self.prompts), cfg.batch.micro_batch * cfg.batch.grad_accum, generation, cfg.run.seed, self.strata
        )
        ids = [self.prompts.ids[i] for i in chosen for _ in range(group)]
        model = self.root.model
        t0 = time.perf_counter()
        with self.autocast(), eager():
            samples = sample(
                model,
                ids,
                settings.max_completion_length,
                self.stop_ids,
                self.pad_id,
                settings.temperature,
                settings.top_p,
                decode=settings.decode,
            )
        generation_s = time.perf_counter() - t0
        texts = self.tokenizer.batch_decode(samples.ids, skip_special_tokens=True)
        prompts = [self.prompts.texts[i] for i in chosen for _ in range(group)]
        per_func = rewards.score(
            self.rewards,
            prompts,
            texts,
            samples.ids,
            [self.prompts.rows[i] for i in chosen for _ in range(group)],
            [i + 1 for i in chosen for _ in range(group)],
        )
        weights = torch.tensor([r.weight for r in self.rewards], dtype=torch.float32)
        adv = advantages(per_func, weights, group, settings.scale_rewards)
        keep = trains_on(adv.advantages, settings).tolist()
        per_micro = cfg.batch.micro_batch * group
        micro = []
        for start in range(0, len(ids), per_micro):
            part = slice(start, start + per_micro)
            rollout = Rollout.build(ids[part], samples.ids[part], self.pad_id, keep[part]).to(self.device)
            micro.append(self.scored(rollout, adv.advantages[part]))
        batch = Generated(micro, samples, texts, per_func, adv, prompts, generation_s, 0)
        batch.sequence_tokens = sum(len(p) + len(c) for p, c in zip(ids, samples.ids))
        batch.metrics = batch_metrics(self.rewards, batch)
        return batch

    def scored(self, rollout: Rollout, adv: torch.Tensor) -> Micro:
        """The micro-batch with its log-probs at generation and under the reference, as the settings need them:
        without autograd and with dropout off, as the sampler drew the completions."""
        if rollout.rows == 0:  # no completion here carries a gradient
            return Micro(rollout)
        settings, root = self.settings, self.root
        was_training = root.training
        root.eval()
        try:
            with torch.no_grad(), self.autocast(), eager():
                old = root.score(rollout).logps if settings.num_iterations > 1 else None
                ref = root.score(rollout, reference=True).logps if settings.beta > 0 else None
        finally:
            root.train(was_training)
        return Micro(rollout, old, ref, adv.to(self.device)[rollout.seq])

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)

    def iterate(self, start: int, stop: int):
        """Each step's micro-batches: a new generation batch every num_iterations steps. Micro-batches without a
        completion that carries a gradient are not run; a step where none does runs one that adds zero gradients,
        so the step is still taken (AdamW's moments and weight decay move the weights as TRL's step would)."""
        for step in range(start, stop):
            if self.batch is None or step % self.unit == 0:
                self.batch = self.generate(step // self.unit)
                self.generation_s += self.batch.generation_s
                every = self.settings.log_completions_steps
                if self.out is not None and every and (step + 1) % every == 0:
                    log_completions(self.out, step + 1, self.batch)
            ran = [m for m in self.batch.micro if m.rollout.rows]
            yield step, ran or self.batch.micro[:1]

    def forward(self, loss_fn: torch.nn.Module, micro: Micro, device: torch.device) -> torch.Tensor:
        """The micro-batch's share of the step's loss (train/grpo.py normalises it: the loop's normaliser is 1)."""
        if micro.rollout.rows == 0:
            trained = [p for p in loss_fn.parameters() if p.requires_grad]
            return sum(p.sum() for p in trained) * 0.0
        out = loss_fn(
            micro.rollout,
            micro.old,
            micro.ref,
            micro.adv,
            micro_batches=len(self.batch.micro),
            step_tokens=self.batch.step_tokens,
        )
        for k, v in out.metrics.items():  # summed in float64, as Python floats would be (no host sync here)
            self.sums[k] = self.sums.get(k, 0.0) + v.detach().double()
        return out.loss

    def step_tokens(self, step: int) -> tuple[int, int, int]:
        self.step_seen += 1
        self.sums["step_tokens"] = self.sums.get("step_tokens", 0.0) + self.batch.step_tokens
        return self.batch.tokens()

    def step_normaliser(self, step: int) -> int:
        return 1

    def padded_tokens(self, steps: range) -> int:
        """Estimated: the batch's rows at their widest (every prompt at seq_len - max_completion_length plus the
        whole completion), a bound the ETA counts down from until the rows' own widths are known."""
        cfg = self.cfg
        if self.batch is not None:
            return len(steps) * self.batch.tokens()[0]
        rows = cfg.batch.micro_batch * cfg.batch.grad_accum * self.settings.num_generations
        return len(steps) * rows * cfg.batch.seq_len

    def window_metrics(self) -> dict:
        """The log line's GRPO metrics: the last generation batch's (TRL's names), the window's clip ratios over
        every completion token, entropy and KL over the tokens the updates ran; generation seconds summed."""
        sums = {k: float(v) for k, v in self.sums.items()}
        step_tokens = max(sums.pop("step_tokens", 0.0), 1.0)
        ran = max(sums.pop("tokens", 0.0), 1.0)
        record = {
            # Not TRL's: how many of the batch's completions the update ran (plan's signal share, `--from-run`).
            "update_completions": sum(m.rollout.rows for m in self.batch.micro),
            "completions_per_batch": sum(m.rollout.sequences for m in self.batch.micro),
            **dict.fromkeys(CLIP_METRICS, 0.0),
            **{k: v / (step_tokens if k in CLIP_METRICS else ran) for k, v in sums.items()},
            **self.batch.metrics,
            "generation_s": self.generation_s,
        }
        self.sums, self.generation_s, self.step_seen = {}, 0.0, 0
        self.last_logged = record
        return record


def eager():
    """Compiled blocks run eager inside: sampling (one token at a time over a growing cache) and scoring run without
    autograd in eval mode, each a graph of its own that would be compiled again at every new shape; the compiled
    graphs are the update's."""
    return torch.compiler.set_stance("force_eager")


def batch_metrics(rewarders: list, batch: Generated) -> dict:
    """The generation batch's metrics as TRL names them."""
    samples, adv, per_func = batch.samples, batch.adv, batch.per_func
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
    for j, reward in enumerate(rewarders):
        out[f"rewards/{reward.name}/mean"] = torch.nanmean(per_func[:, j]).item()
        out[f"rewards/{reward.name}/std"] = _std(per_func[:, j])
    return out


def _std(x: torch.Tensor) -> float:
    value = nanstd(x).item()
    return 0.0 if math.isnan(value) else value


def log_completions(out: Path, step: int, batch: Generated) -> None:
    rows = [
        {"step": step, "prompt": p, "completion": c, "reward": float(r), "advantage": float(a)}
        for p, c, r, a in zip(batch.prompts, batch.texts, batch.adv.rewards, batch.adv.advantages)
    ][:COMPLETIONS_LOGGED]
    with (out / COMPLETIONS).open("a") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


@dataclass(kw_only=True)
class GrpoRun:
    """One GRPO job once set up: what `fit` trains and `summarize` reports."""

    cfg: TrainConfig
    out: Path
    procs: distributed.Processes
    prep: Prepared  # its `schedule` is the GrpoSource, its `data` the prompts
    source: GrpoSource
    memwatch: MemoryWatch
    accelerator: object
    strategy: Strategy
    trainee: Trainee
    state: TrainState
    logged_first_loss: float | None
    show_progress: bool


def setup(cfg: TrainConfig, out: Path, procs: distributed.Processes | None = None, show_progress: bool = False):
    """Everything before the first step: prompts and rewards (checked before the model loads), the model built and
    handed to Accelerate as SFT's is (recipes/strategy.py), the checkpoint resumed from, the output directory."""
    settings = cfg.objective.grpo
    loaded = rewards.load_all(settings.rewards)  # a missing file or function fails before the model loads
    procs = procs or distributed.Processes(0, 1, pick_device(cfg.compute.device))
    device = procs.device
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
    resume_from = checkpoint.find(out / "checkpoints", cfg.run.resume) if cfg.run.resume else None
    if resume_from is not None:  # a checkpoint of other weight-shaping settings fails before the model loads
        checkpoint.check_identity(resume_from, weights_identity(cfg))
    tokenizer = sources.load_tokenizer(source)
    prompts = prepare(cfg.data_specs()[0], tokenizer)
    strata = balance_values(prompts, settings.balance_by, cfg.data.path)
    batches = GrpoSource(cfg, prompts, tokenizer, strata, steps_for(cfg, len(prompts)))
    prep = Prepared(
        device=device,
        precision=precision,
        source=source,
        model_config=None,
        tokenizer=tokenizer,
        data=prompts,
        schedule=batches,
        # `compile: auto` has no prediction of a GRPO run's eager time to weigh compiling against: eager blocks.
        compile=compile_choice(cfg.compute.compile, device.type, None, 0.0, 1.0),
    )
    if show_progress:
        print(prep.compile.why, flush=True)
    torch.manual_seed(cfg.run.seed)
    accelerator = make_accelerator(cfg, precision.name, device, out)
    strategy = pick_strategy(accelerator, procs, cfg)
    trainee = strategy.setup(accelerator, lambda dev, meta: build_policy(cfg, prep, dev), cfg.optimizer, cfg, prep)
    stop = stops(trainee.model, tokenizer, cfg.data.format)
    batches.rewards, batches.root, batches.device, batches.dtype = loaded, trainee.root, device, precision.compute
    batches.stop_ids = stop.ids
    batches.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop.ids[0]
    batches.out = out if procs.main else None
    state = TrainState() if resume_from is None else strategy.load_checkpoint(resume_from, trainee)
    first_loss = None
    if procs.main:
        first_loss = outputs.start_logs(cfg, out, resume_from, state.step, show_progress, logs=(COMPLETIONS,))
    return GrpoRun(
        cfg=cfg,
        out=out,
        procs=procs,
        prep=prep,
        source=batches,
        memwatch=MemoryWatch(device),
        accelerator=accelerator,
        strategy=strategy,
        trainee=trainee,
        state=state,
        logged_first_loss=first_loss,
        show_progress=show_progress,
    )


def build_policy(cfg: TrainConfig, prep: Prepared, device: torch.device | None = None) -> torch.nn.Module:
    """The policy: the base over padded rows (SDPA), its adapter, its decoder layers checkpointed (grad_ckpt; in the
    update only: sampling and scoring run without autograd, where the layers run plain), for sampling and scoring
    each fused layer's [W | sB] packed once (model/lora_linear.pack_for_inference), or its blocks compiled as SFT's
    (`compile`; the update runs them, sampling and scoring run eager: `eager`)."""
    model = mload.load_model(prep.source, prep.precision.compute, cfg.adapter.quant, device or prep.device, attn="sdpa")
    model = apply_adapter(model, cfg.adapter)
    offload.apply(model, cfg.compute.activation_offload, cfg.compute.grad_ckpt)
    if prep.compile is not None and prep.compile.chosen:
        # Not packed: [W | sB] holds W as a view its refresh writes into, an input mutation that AOTAutograd
        # cannot trace in the compiled update; the sampler packs a copy for each call (model/prepack.py).
        compile_blocks(model)
    else:
        pack_for_inference(model)
    return model


def train(cfg: TrainConfig, show_progress: bool = True, measure: Measurement | None = None) -> RunSummary:
    """The recipe of objective grpo (objectives.Objective.recipe): run a GRPO job and return its summary (also
    written to output_dir/summary.json). `measure`: what a measuring caller asks of the run (stop before the
    schedule's end, the steps kept out of the summary's rates, a per-step callback)."""
    refusal = objectives.lacking(cfg.objective.row, "processes", "run it without --nproc")
    if refusal and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise TunelabError(refusal)
    trackers.check_available(cfg.run.report_to)
    out = Path(cfg.run.output_dir)
    t0 = time.perf_counter()
    with outputs.held(out):
        run = setup(cfg, out, show_progress=show_progress)
        result = run_loop(run, measure or Measurement())
        summary = summarize(run, result, time.perf_counter() - t0)
        outputs.write_summary(out, summary.as_dict())
    return summary


def run_loop(run: GrpoRun, measure: Measurement) -> LoopResult:
    """The shared loop (train/loop.run) over the GRPO source, with its trackers, then the final save."""
    cfg, out, state, trainee = run.cfg, run.out, run.state, run.trainee
    tracking = trackers.setup(cfg.run.report_to, out, state.step) if run.procs.main else None
    # grpo.schedule_within_limit is the run's schedule_within_limit (train/loop.ScheduleToLimit), under its earlier name.
    run_spec = replace(
        cfg.run, schedule_within_limit=cfg.run.schedule_within_limit or cfg.objective.grpo.schedule_within_limit
    )
    with outputs.tracking(run.accelerator, tracking, cfg, run.show_progress) as track:
        result = loop.run(
            loop.LoopContext(
                accelerator=run.accelerator,
                loss_fn=trainee.loss_fn,
                optimizer=trainee.optimizer,
                scheduler=trainee.scheduler,
                schedule=run.source,
                optim=cfg.optimizer,
                spec=loop.LoopSpec(run=run_spec, identity=weights_identity(cfg)),
                measure=measure,
                out_dir=out if run.procs.main else None,
                memwatch=run.memwatch,
                state=state,
                progress=ProgressView(run.source.total_steps, state.step, enabled=run.show_progress),
                track=track,
            )
        )
    if result.finished and run.procs.main:
        outputs.save_final(trainee.model, run.prep.tokenizer, out, cfg.adapter.method)
    if run.show_progress and result.time_limited:
        outputs.say_time_limited(cfg.run.max_minutes, state.step, run.source.total_steps)
    return result


def summarize(run: GrpoRun, result: LoopResult, total_s: float) -> RunSummary:
    """The run's summary, in the record every objective's recipe returns."""
    cfg = run.cfg
    return outputs.summarize(
        run,
        result,
        # What the model was trained to write at most: `tunelab eval` caps its generation there (plus slack).
        data={
            "prompts": len(run.prep.data),
            "prompts_dropped": run.prep.data.dropped,
            "response_tokens_max": cfg.objective.grpo.max_completion_length,
        },
        total_steps=run.source.total_steps,  # the config's; a schedule fitted to max_minutes ends at schedule_steps
        packing=False,  # rollouts are right-padded rows
        elapsed_s=total_s,
        early_stopped=False,
        reward_last=run.source.last_logged.get("reward"),
    )
