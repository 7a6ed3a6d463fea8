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
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from .. import allocator, sources
from ..config import TrainConfig
from ..data.pipeline import prepare
from ..data.prompts import PromptData
from ..device import pick_device, pick_precision
from ..errors import TunelabError
from ..eval.generate import stops
from ..eval.sampling import sample
from ..memwatch import MemoryWatch
from ..model import attention
from ..model.lora_linear import pack_for_inference
from ..runtime import compile_choice
from ..train import checkpoint, distributed, launch, loop, rewards, trackers
from ..train.checkpoint import TrainState
from ..train.grpo import GrpoLoss, Rollout, advantages, nanstd, trains_on
from ..train.loop import LoopResult, Measurement
from . import outputs
from .finetune import Prepared, build_model, loop_context, make_accelerator, weights_identity
from .strategy import Strategy, Trainee, pick_strategy
from .summary import RunSummary

COMPLETIONS = "completions.jsonl"  # sampled completions, every grpo.log_completions_steps
COMPLETIONS_LOGGED = 4  # completions per logged step in completions.jsonl
CLIP_METRICS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")  # over completion tokens
PER_MICRO_BATCH = ("clip_ratio/low_min", "clip_ratio/high_max")  # a micro-batch's, averaged over the window's


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
    """One generation batch: this process's completions and micro-batches, and the whole batch's rewards,
    advantages, lengths and token counts (every process's, gathered: the advantages are the one-process run's)."""

    micro: list[Micro]
    texts: list[str]  # this process's completions
    prompts: list[str]
    per_func: torch.Tensor  # (N, R) the whole batch's
    adv: object  # train/grpo.Advantages of the whole batch
    lengths: torch.Tensor  # (N,) completion lengths
    clipped: torch.Tensor  # (N,) bool
    first: int  # this process's first completion in the batch
    micro_batches: int  # every process's micro-batches: the loss's denominator (TRL's gradient accumulation steps)
    step_tokens: int  # the batch's completion tokens, the left-out completions' included (dapo's denominator)
    padded: int  # the rows the update runs, padding included, every process's
    sequence_tokens: int  # the batch's prompts and completions, without padding
    generation_s: float
    metrics: dict = field(default_factory=dict)  # batch_metrics: TRL's names

    def tokens(self) -> tuple[int, int, int]:
        """One update's tokens over every process: padded (the rows it ran, padding included), non-padding (the
        batch's prompts and completions) and with loss (the completions' tokens)."""
        return self.padded, self.sequence_tokens, self.step_tokens


def shares(count: int, world: int) -> list[tuple[int, int]]:
    """Each process's share of a step's `count` prompts, (start, stop) in rank order: contiguous and as even as
    possible, so that a prompt's group of completions stays within one process and rank order is the batch's."""
    base, extra = divmod(count, world)
    bounds = [0]
    for rank in range(world):
        bounds.append(bounds[-1] + base + (rank < extra))
    return list(zip(bounds[:-1], bounds[1:]))


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
        self.procs = distributed.Processes(0, 1, torch.device("cpu"))
        self.accelerator = None  # reduces across processes (several processes only)
        self.sharded = False  # the strategy shards the weights: every process runs the same forwards
        self.batch: Generated | None = None
        self.step_seen = 0  # updates since the last log line, and what they summed (train/grpo.TokenLoss.metrics)
        self.sums: dict[str, torch.Tensor] = {}
        self.generation_s = 0.0
        self.last_logged: dict = {}

    def generate(self, generation: int) -> Generated:
        """Generation batch `generation`: completions, rewards, advantages, rollouts, old and reference log-probs.
        Under several processes each samples and scores its share of the batch's prompts (`shares`) and the rewards
        are gathered, so every process computes the whole batch's advantages and metrics and keeps its own."""
        cfg, settings, group = self.cfg, self.settings, self.settings.num_generations
        chosen = prompt_order(
            len(self.prompts), cfg.batch.micro_batch * cfg.batch.grad_accum, generation, cfg.run.seed, self.strata
        )
        world = self.procs.world
        parts = shares(len(chosen), world)
        start, stop = parts[self.procs.rank]
        mine = chosen[start:stop]
        ids = [self.prompts.ids[i] for i in mine for _ in range(group)]
        model = self.root.model
        t0 = time.perf_counter()
        with self.autocast(), eager(), self.unsharded(), attention.with_padding_masks(model):
            samples = sample(
                model,
                ids,
                settings.max_completion_length,
                self.stop_ids,
                self.pad_id,
                settings.temperature,
                settings.top_p,
                decode=settings.decode,
                share=(start * group, len(chosen) * group) if world > 1 else None,
                all_done=self.all_done if world > 1 else None,
            )
        generation_s = time.perf_counter() - t0
        texts = self.tokenizer.batch_decode(samples.ids, skip_special_tokens=True)
        prompts = [self.prompts.texts[i] for i in mine for _ in range(group)]
        per_func = rewards.score(
            self.rewards,
            prompts,
            texts,
            samples.ids,
            [self.prompts.rows[i] for i in mine for _ in range(group)],
            [i + 1 for i in mine for _ in range(group)],
        )
        lengths = torch.tensor([len(c) for c in samples.ids], dtype=torch.float32)
        clipped = torch.tensor(samples.clipped, dtype=torch.bool)
        sequence_tokens = sum(len(p) + len(c) for p, c in zip(ids, samples.ids))
        if world > 1:
            per_func, lengths, clipped, sequence_tokens = self.gathered(per_func, lengths, clipped, sequence_tokens)
        weights = torch.tensor([r.weight for r in self.rewards], dtype=torch.float32)
        adv = advantages(per_func, weights, group, settings.scale_rewards)
        first = start * group
        own = adv.advantages[first : first + len(ids)]
        # One process leaves out the completions without a gradient; under several every process runs all of its
        # micro-batches, so that each runs the same forwards and DDP's reduction sees every one of them.
        keep = trains_on(own, settings).tolist() if world == 1 else [True] * len(ids)
        per_micro = cfg.batch.micro_batch * group
        micro = []
        for at in range(0, len(ids), per_micro):
            part = slice(at, at + per_micro)
            rollout = Rollout.build(ids[part], samples.ids[part], self.pad_id, keep[part]).to(self.device)
            # The kept completions' advantages, in the order of the rollout's rows (Rollout.seq indexes them).
            micro.append(self.scored(rollout, own[part][torch.tensor(keep[part], dtype=torch.bool)]))
        counts = [math.ceil((b - a) / cfg.batch.micro_batch) for a, b in parts]
        padded = sum(m.rollout.input_ids.numel() for m in micro)
        if world > 1:
            padded = int(self.reduced(torch.tensor([float(padded)]))[0])
        batch = Generated(
            micro=micro,
            texts=texts,
            prompts=prompts,
            per_func=per_func,
            adv=adv,
            lengths=lengths,
            clipped=clipped,
            first=first,
            micro_batches=sum(counts),
            step_tokens=int(lengths.sum().item()),
            padded=padded,
            sequence_tokens=sequence_tokens,
            generation_s=generation_s,
        )
        batch.metrics = batch_metrics(self.rewards, batch)
        return batch

    def gathered(self, per_func: torch.Tensor, lengths: torch.Tensor, clipped: torch.Tensor, sequence_tokens: int):
        """Every process's rewards, completion lengths and clipped flags in rank order (the batch's), and the
        batch's non-padding tokens."""
        from accelerate.utils import gather_object

        mine = [(per_func.tolist(), lengths.tolist(), clipped.tolist(), sequence_tokens)]
        every = gather_object(mine)
        return (
            torch.tensor([row for p in every for row in p[0]], dtype=torch.float32).view(-1, per_func.shape[1]),
            torch.tensor([x for p in every for x in p[1]], dtype=torch.float32),
            torch.tensor([x for p in every for x in p[2]], dtype=torch.bool),
            sum(p[3] for p in every),
        )

    def reduced(self, values: torch.Tensor) -> torch.Tensor:
        """`values` summed over the processes (on the host)."""
        return self.accelerator.reduce(values.to(self.accelerator.device), "sum").cpu()

    def all_done(self, done: bool) -> bool:
        """Whether every process's completions are done: each takes the same decode steps (distributed sampling)."""
        return self.reduced(torch.tensor([0.0 if done else 1.0]))[0].item() == 0

    def unsharded(self):
        """Sampling and scoring call the policy's modules below the FSDP root, whose own weights (embeddings,
        final norm, LM head) they need gathered (distributed.unsharded_root); the blocks gather theirs."""
        return distributed.unsharded_root(self.root) if self.sharded else nullcontext()

    def scored(self, rollout: Rollout, adv: torch.Tensor) -> Micro:
        """The micro-batch with its log-probs at generation and under the reference, as the settings need them:
        without autograd and with dropout off, as the sampler drew the completions."""
        if rollout.rows == 0:  # no completion here carries a gradient
            return Micro(rollout)
        settings, root = self.settings, self.root
        was_training = root.training
        root.eval()
        try:
            with torch.no_grad(), self.autocast(), eager(), self.unsharded():
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
            micro_batches=self.batch.micro_batches,
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
        every completion token, entropy and KL over the tokens the updates ran, the per-completion clip extremes
        over its micro-batches (each summed over the processes); generation seconds summed (the main process's)."""
        step_tokens = max(float(self.sums.pop("step_tokens", 0.0)), 1.0)
        kl = ["kl"] if self.settings.beta != 0.0 else []
        names = [*CLIP_METRICS, *PER_MICRO_BATCH, "micro_batches", "tokens", "entropy", *kl]
        ran = float(sum(m.rollout.rows for m in self.batch.micro))
        values = torch.tensor([float(self.sums.get(k, 0.0)) for k in names] + [ran], dtype=torch.float64)
        if self.procs.world > 1:
            values = self.reduced(values)
        *values, ran = values.tolist()
        sums = dict(zip(names, values))
        micro_batches, tokens = sums.pop("micro_batches"), sums.pop("tokens")
        record = {
            # Not TRL's: how many of the batch's completions the update ran (plan's signal share, `--from-run`).
            "update_completions": int(ran),
            "completions_per_batch": len(self.batch.lengths),
            **{k: sums[k] / step_tokens for k in CLIP_METRICS},
            **({k: sums[k] / micro_batches for k in PER_MICRO_BATCH} if micro_batches else {}),
            **({k: sums[k] / tokens for k in ("entropy", *kl)} if tokens else {}),
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
    """The generation batch's metrics as TRL names them (trl/trainer/grpo_trainer.py, `_generate_and_score_completions`
    and `_compute_loss`), over every process's completions."""
    adv, per_func, lengths, clipped = batch.adv, batch.per_func, batch.lengths, batch.clipped
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
        "completions/min_terminated_length": done.min().item() if len(done) else 0.0,
        "completions/max_terminated_length": done.max().item() if len(done) else 0.0,
    }
    for j, reward in enumerate(rewarders):
        out[f"rewards/{reward.name}/mean"] = torch.nanmean(per_func[:, j]).item()
        out[f"rewards/{reward.name}/std"] = _std(per_func[:, j])
    return out


def _std(x: torch.Tensor) -> float:
    value = nanstd(x).item()
    return 0.0 if math.isnan(value) else value


def log_completions(out: Path, step: int, batch: Generated) -> None:
    """The main process's first completions (its share starts the batch)."""
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


def setup(cfg: TrainConfig, out: Path, procs: distributed.Processes, show_progress: bool = False):
    """Everything before the first step: prompts and rewards (checked before the model loads), the model built and
    handed to Accelerate as SFT's is (recipes/strategy.py), the checkpoint resumed from, the output directory."""
    settings = cfg.objective.grpo
    launch.check_prompt_shares(cfg, procs.world, "config")
    loaded = rewards.load_all(settings.rewards)  # a missing file or function fails before the model loads
    device = procs.device
    if device.type == "cpu":
        # Rollouts change shape every batch, so freed pages are not reused: they are freed lazily (allocator.DECAY_MS)
        # and never returned for good. Returning them (RETURN_MS) made the quickstart's run 16-29% slower in page
        # faults (benchmarks/design-decisions_cpu_2026-11-28.md#grpo-frees-pages-lazily-only).
        allocator.decay_freed_pages(allocator.DECAY_MS, returned_ms=-1)
    # Before the model loads: CPU peak memory is relative to this RSS (docs/metrics.md), as SFT's (finetune.setup).
    memwatch = MemoryWatch(device)
    memwatch.start()
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
    if strategy.sharded:
        check_sharded_shares(cfg, procs.world)
    trainee = strategy.setup(
        accelerator,
        lambda dev, meta: build_policy(cfg, prep, dev, meta, pack=not strategy.sharded),
        cfg.optimizer,
        cfg,
        prep,
    )
    stop = stops(trainee.model, tokenizer, cfg.data.format)
    batches.rewards, batches.root, batches.device, batches.dtype = loaded, trainee.root, device, precision.compute
    batches.procs, batches.accelerator, batches.sharded = procs, accelerator, strategy.sharded
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
        memwatch=memwatch,
        accelerator=accelerator,
        strategy=strategy,
        trainee=trainee,
        state=state,
        logged_first_loss=first_loss,
        show_progress=show_progress,
    )


def check_sharded_shares(cfg: TrainConfig, world: int) -> None:
    """Under sharded weights every process runs the same forwards: the same number of micro-batches each step."""
    prompts = cfg.batch.micro_batch * cfg.batch.grad_accum
    counts = {math.ceil((b - a) / cfg.batch.micro_batch) for a, b in shares(prompts, world)}
    if len(counts) > 1:
        raise TunelabError(
            f"config: micro_batch {cfg.batch.micro_batch} x grad_accum {cfg.batch.grad_accum} prompts a step give "
            f"the {world} processes of a sharded (FSDP) run unequal micro-batches; make grad_accum a multiple of "
            f"{world}, or micro_batch x grad_accum one of {world} with grad_accum 1"
        )


def build_policy(
    cfg: TrainConfig, prep: Prepared, device: torch.device | None = None, meta: bool = False, pack: bool = True
) -> torch.nn.Module:
    """The policy: SFT's model (finetune.build_model: the adapter or full fine-tuning, checkpointed or offloaded
    decoder layers, compiled blocks), over padded rows with SDPA unless `attention` names another path; sampling
    and scoring run without autograd, where checkpointing and offloading do nothing and the compiled blocks run
    eager (`eager`). Eager and unsharded (`pack`), each fused LoRA layer's [W | sB] is packed once for sampling and
    scoring (model/lora_linear.pack_for_inference)."""
    attn = None  # the `attention` setting's, unless auto
    if cfg.compute.attention == "auto":
        # Whole right-padded rows: on a CPU each row a causal slot of explicit products (attention.rows_attention)
        attn = attention.register_rows() if prep.device.type == "cpu" else "sdpa"
    model = build_model(cfg, prep, device, meta, attn=attn)
    if pack and not (prep.compile is not None and prep.compile.chosen):
        # Not under compiled blocks: [W | sB] holds W as a view its refresh writes into, an input mutation that
        # AOTAutograd cannot trace in the compiled update (the sampler packs a copy for each call instead,
        # model/prepack.py). Not under sharding, which replaces W with its shard.
        pack_for_inference(model)
    return model


def train(cfg: TrainConfig, show_progress: bool = True, measure: Measurement | None = None) -> RunSummary:
    """The recipe of objective grpo (objectives.Objective.recipe): run a GRPO job and return its summary (also
    written to output_dir/summary.json). `measure`: what a measuring caller asks of the run (stop before the
    schedule's end, the steps kept out of the summary's rates, a per-step callback). Under `accelerate launch`
    each process samples its share of every step's prompts and only the main process touches output_dir."""
    trackers.check_available(cfg.run.report_to)
    out = Path(cfg.run.output_dir)
    t0 = time.perf_counter()
    procs = distributed.join(pick_device(cfg.compute.device))
    with outputs.held(out, procs.main):
        run = setup(cfg, out, procs, show_progress=show_progress and procs.main)
        result = run_loop(run, measure or Measurement())
        summary = summarize(run, result, time.perf_counter() - t0)
        if procs.main:
            outputs.write_summary(out, summary.as_dict())
    return summary


def run_loop(run: GrpoRun, measure: Measurement) -> LoopResult:
    """The shared loop (train/loop.run) over the GRPO source, with its trackers, then the final save."""
    cfg, out, state, trainee = run.cfg, run.out, run.state, run.trainee
    gather = run.strategy.gather(trainee, cfg.adapter.row.adapter)
    tracking = trackers.setup(cfg.run.report_to, out, state.step) if run.procs.main else None
    # grpo.schedule_within_limit is the run's schedule_within_limit (train/loop.ScheduleToLimit), under its earlier name.
    run_spec = replace(
        cfg.run, schedule_within_limit=cfg.run.schedule_within_limit or cfg.objective.grpo.schedule_within_limit
    )
    with outputs.tracking(run.accelerator, tracking, cfg, run.show_progress) as track:
        result = loop.run(loop_context(run, run.source, measure, track, run_spec))
    weights = gather() if result.finished and gather is not None else None  # every process takes part in gathering
    if result.finished and run.procs.main:
        outputs.save_final(trainee.model, run.prep.tokenizer, out, cfg.adapter.method, weights)
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
