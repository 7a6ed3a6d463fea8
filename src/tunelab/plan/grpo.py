"""plan's prediction of a GRPO run on one device (objective grpo): a generation batch by part (plan/generation.py's
sampling, the scoring passes, the update from plan's step model over rows of prompt plus completion, scaled by the
device's GRPO fit, catalog/grpo.yaml), the batches of the run within its time limit, and the memory. The decode steps
and the update's share of completions are upper bounds unless a trial run measured them (`grpo_trial`), whose times
on the machine it ran on also scale plan's rates (`trial_rates`). Torch-free; the arch, the prompts' lengths and
the device come from the caller (recipes/predict.py)."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import config as cfgmod
from ..errors import TunelabError
from . import catalog, steptime, timing, workload
from .arch import Arch
from .estimate import Device, compute_bytes, constants_key, estimate
from .generation import GrpoStep, generation, sampling_memory
from .job import Job
from .memory import fp32_master


@dataclass(frozen=True)
class GrpoTrial:
    """What a GRPO run measured that plan otherwise assumes at its upper bound, and its times: the median batch's
    sampling and the rest of it (rewards, scoring passes, update)."""

    completion_tokens: float  # the median over generation batches of the longest completion: the decode steps
    signal_share: float  # the mean share of completions the update ran on
    batches: int
    generation_s: float = 0.0  # the median batch's sampling seconds
    rest_s: float | None = None  # the median batch's seconds after sampling, from the second batch on (None: one)
    config: cfgmod.TrainConfig | None = None  # the run's config.yaml: the batch shape those times are for


@dataclass(frozen=True)
class Prompts:
    """The run's prompts as plan sees them: how many, their mean tokens, where that comes from; and, where the rows
    say what a completion is (a response or `answer` field), each prompt's completion in tokens (EOS included,
    capped at max_completion_length) and the field it was read from."""

    count: int
    mean_tokens: float
    source: str
    completion_lengths: tuple[int, ...] = ()
    completion_field: str = ""


def expected_longest(lengths: tuple[int, ...] | list[int], draws: int) -> float:
    """The expected longest of `draws` lengths drawn at random from `lengths`: a generation batch decodes until its
    longest completion stops, and a prompt's G completions are about as long as each other. E[max] =
    Σ_k k·(F(k)^n − F(k−1)^n) over the lengths' empirical distribution F (docs/formulas.md#grpo-decode-steps)."""
    ordered = sorted(lengths)
    total = len(ordered)
    expected, below, seen = 0.0, 0.0, 0
    for k in sorted(set(ordered)):
        seen += ordered.count(k)
        at_most = (seen / total) ** draws
        expected += k * (at_most - below)
        below = at_most
    return expected


@dataclass(frozen=True)
class GrpoWorkload:
    """A GRPO run's workload beyond its config: the decode steps of a generation batch, which run until its longest
    completion stops (default max_completion_length, an upper bound), and the share of completions whose group's
    rewards differ, the only ones the update runs with beta 0 (default 1, an upper bound); a short trial run
    measures both (`grpo_trial`)."""

    completion_tokens: float | None = None
    signal_share: float | None = None
    grpo_from: str | None = None  # where those two come from (a trial run's folder), for plan's text
    # That trial run's measured times: on `--gpu local` (the machine it ran on) they scale plan's sampling and
    # update rates to this machine's (`trial_rates`).
    trial: GrpoTrial | None = None


@dataclass(frozen=True)
class GeneratingPlan:
    """plan's prediction of a GRPO run on one device: a generation batch by part, the batches, the memory."""

    device: str
    prompts: int
    prompt_tokens: float
    step: GrpoStep
    batches: int  # generation batches in the run
    memory_bytes: int  # the update's memory (plan/memory.py) plus the sampler's (generation.sampling_memory)
    source: str
    # The schedule's batches where `max_minutes` ends the run before them (then `batches` are those that run); 0
    # when it does not.
    time_limited_from: int = 0
    assumption: str = ""  # the decode steps and the update's share: where each comes from
    # schedule_within_limit (or grpo.schedule_within_limit): the learning-rate schedule ends with the batches that fit.
    schedule_fitted: bool = False
    # memory_bytes by part: the update's (plan/memory.py's breakdown, the reference's frozen copy included) and the
    # sampler's (generation.SamplingMemory)
    memory_parts: dict = field(default_factory=dict)

    @property
    def time_s(self) -> float:
        return self.batches * self.step.batch_s


def grpo_trial(run_dir: str | Path) -> GrpoTrial:
    """The decode steps, the update's share of completions and the batch's times a GRPO run measured (its
    metrics.jsonl and config.yaml): a short trial run of the same config calibrates plan's two workload
    assumptions, and on the machine it ran on, plan's rates."""
    path = Path(run_dir) / "metrics.jsonl"
    try:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        raise TunelabError(f"{path}: cannot read a GRPO run's metrics ({e}); point --from-run at a GRPO run folder")
    batches = [r for r in records if r.get("generation_s", 0) > 0 and "completions/max_length" in r]
    if not batches:
        raise TunelabError(f"{path}: no generation batches logged; run the GRPO config for a few steps first")
    share = [
        r["update_completions"] / r["completions_per_batch"]
        if "update_completions" in r
        else 1 - r["frac_reward_zero_std"]
        for r in batches
    ]
    # A batch's time is the elapsed time between two generation batches' records; the first batch's also holds
    # the run's warm-up, so it is left out.
    rest = [
        b["elapsed_s"] - a["elapsed_s"] - b["generation_s"]
        for a, b in zip(batches, batches[1:])
        if "elapsed_s" in a and "elapsed_s" in b
    ]
    config = Path(run_dir) / "config.yaml"
    return GrpoTrial(
        statistics.median(r["completions/max_length"] for r in batches),
        statistics.fmean(share),
        len(batches),
        statistics.median(r["generation_s"] for r in batches[1:] or batches),
        statistics.median(rest) if rest else None,
        cfgmod.load_config(config) if config.is_file() else None,
    )


def grpo_workload(completion_tokens=None, signal_share=None, from_run=None) -> GrpoWorkload:
    """The GRPO workload from the values given, or from a trial run's folder (`from_run`) when named."""
    if from_run is None:
        return GrpoWorkload(completion_tokens, signal_share)
    trial = grpo_trial(from_run)
    return GrpoWorkload(
        trial.completion_tokens, trial.signal_share, f"{from_run} ({trial.batches} generation batches)", trial
    )


# plan_grpo's `constants` default: the device's GRPO fit as catalog/grpo.yaml ships it.
SHIPPED = "catalog/grpo.yaml"


def plan_grpo(
    job: Job,
    arch: Arch,
    prompts: Prompts,
    load: GrpoWorkload,
    device: Device,
    trial_arch: Arch | None = None,
    constants: catalog.GrpoConstants | None | str = SHIPPED,
) -> GeneratingPlan:
    """GRPO's prediction on `device`: each batch's decode runs `load.completion_tokens` steps (default: the rows'
    expected longest completion, else max_completion_length) and, with beta 0, the update runs over
    `load.signal_share` of the completions (default all). A local device's rates are scaled by `load.trial`'s
    measured times (its model's arch: `trial_arch`). `constants`: the GRPO fit to apply (None: none; plan/grpo_fit.py
    fits them)."""
    g, b = job.objective.grpo, job.batch
    per_batch = b.micro_batch * b.grad_accum
    if load.completion_tokens:
        steps = min(load.completion_tokens, g.max_completion_length)
    elif prompts.completion_lengths:  # the batch's longest expected completion, from the rows
        steps = round(expected_longest(prompts.completion_lengths, per_batch), 1)
    else:
        steps = g.max_completion_length
    share = 1.0 if g.beta > 0 or load.signal_share is None else load.signal_share
    if not 0 < steps or not 0 <= share <= 1:
        raise TunelabError(
            f"completion tokens must be above 0 and the signal share within 0-1; got {steps:g} and {share:g}"
        )
    assumption = grpo_assumption(g, load, steps, prompts, per_batch)
    lengths = workload.Lengths(
        prompts.count * g.num_generations, prompts.mean_tokens + steps, float(steps), source=prompts.source
    )
    batches = (
        math.ceil(b.max_steps / g.num_iterations) if b.max_steps else math.ceil(b.epochs * prompts.count / per_batch)
    )
    step, update = grpo_step(job, arch, prompts.mean_tokens, steps, share, lengths, device, constants)
    local = device.gpu.id == "local"  # the machine the trial ran on
    rates = trial_rates(load.trial, job, arch, prompts.mean_tokens, lengths, device, trial_arch) if local else None
    if rates:
        step = scaled_step(step, *rates)
        assumption += f"; this machine's rates from the trial: sampling x{rates[0]:.2f}, the rest x{rates[1]:.2f}"
    # The sampler's buffers are added to the update's peak, not maxed with it: on a CPU the freed pages are kept
    # for reuse, not returned (recipes/grpo.setup), and the rollouts' shapes change every batch.
    unpacked = job.compute.compile is True and not job.method.trains_base
    cpu = device.gpu.device_type == "cpu"
    sampling = sampling_memory(arch, step.generation, compute_bytes(job, device), cpu, unpacked, fp32_master(job))
    memory = update.memory.total + sampling.total
    # The run checks its time limit between generation batches (train/loop.run, BatchSource.unit).
    runs = timing.steps_within(job.run.max_minutes * 60, batches, batches * step.batch_s, 0.0)
    return GeneratingPlan(
        device.gpu.name,
        prompts.count,
        prompts.mean_tokens,
        step,
        runs,
        memory,
        prompts.source,
        batches if runs < batches else 0,
        assumption,
        g.schedule_within_limit or job.run.schedule_within_limit,
        {
            **update.memory.as_dict(),
            "sampling kv cache": sampling.kv_cache,
            "sampling logits": sampling.logits,
            "sampling packed weights": sampling.packed_weights,
        },
    )


def grpo_step(
    job: Job,
    arch: Arch,
    mean: float,
    steps: float,
    share: float,
    lengths,
    device: Device,
    constants: catalog.GrpoConstants | None | str = SHIPPED,
):
    """(one generation batch and its optimizer steps by part, plan's estimate of the update) on `device`, for
    `steps` decode steps and the update over `share` of the completions, under the GRPO fit `constants`."""
    g, b = job.objective.grpo, job.batch
    update_job = job.but(micro_batch=b.micro_batch * g.num_generations, packing=False, compile=False, max_steps=1)
    update = estimate(arch, lengths, update_job, device)
    gpu = device.gpu
    bandwidth = gpu.bandwidth_gbs * 1e9 or catalog.nearest_bandwidth(gpu.peak_flops)
    fit = catalog.grpo_constants(constants_key(device)) if isinstance(constants, str) else constants
    overhead = forward_launch_s(arch, update, device, fit.decode_op_s if fit else None)
    gen = generation(
        arch,
        b.micro_batch * b.grad_accum * g.num_generations,
        mean,
        steps,
        compute_bytes(update_job, device),
        gpu.peak_flops,
        bandwidth,
        overhead,
        distinct_prompts=b.micro_batch * b.grad_accum,
        decode_flop_efficiency=fit.decode_flop_efficiency if fit else 1.0,
    )
    passes = int(g.num_iterations > 1) + int(g.beta > 0)
    # The update and the old log-probs' pass run over the completions that carry a gradient (train/grpo.py).
    update_s = update.step.total * (fit.update_scale if fit else 1.0) * share
    scoring = fit.scoring_scale if fit else 1.0
    return GrpoStep(gen, passes, update_s, g.num_iterations, scoring, share), update


def trial_rates(trial, job: Job, arch: Arch, mean: float, lengths, device: Device, trial_arch: Arch | None = None):
    """(sampling, the rest) measured over predicted for a trial run's own batch on this machine, or None without
    its times: the factors that turn plan's rates for this machine into the ones the trial measured. The trial's
    batch shape is its config.yaml's (this job's where it has none; its model's arch `trial_arch`), its prompts
    this job's."""
    if trial is None or trial.rest_s is None:
        return None
    tjob = job if trial.config is None else Job.of(trial.config)
    tarch = trial_arch or arch
    tsteps = min(trial.completion_tokens, tjob.objective.grpo.max_completion_length)
    tshare = 1.0 if tjob.objective.grpo.beta > 0 else trial.signal_share
    tlengths = replace(lengths, mean_tokens=mean + tsteps, mean_loss_tokens=float(tsteps))
    predicted, _ = grpo_step(tjob, tarch, mean, tsteps, tshare, tlengths, device)
    rest = predicted.batch_s - predicted.generation.total_s
    if predicted.generation.total_s <= 0 or rest <= 0:
        return None
    return trial.generation_s / predicted.generation.total_s, trial.rest_s / rest


def scaled_step(step: GrpoStep, sampling: float, rest: float) -> GrpoStep:
    """`step` with its sampling times `sampling` times and its scoring passes and update `rest` times as long."""
    gen = replace(
        step.generation, prefill_s=step.generation.prefill_s * sampling, decode_s=step.generation.decode_s * sampling
    )
    return replace(step, generation=gen, update_s=step.update_s * rest)


def grpo_assumption(
    g: cfgmod.GrpoConfig, load: GrpoWorkload, steps: float, prompts: Prompts | None = None, per_batch: int = 1
) -> str:
    """plan's text on where a GRPO plan's decode steps and update share come from."""
    given = f"from {load.grpo_from}" if load.grpo_from else "given"
    if load.completion_tokens:
        decode = f"the decode steps {given}"
    elif prompts is not None and prompts.completion_lengths:
        decode = (
            f"the decode steps from the rows: each prompt's `{prompts.completion_field}` tokenized plus EOS, the "
            f"longest of a batch's {per_batch} prompts expected at {steps:g} tokens (cap {g.max_completion_length}; "
            "a model that writes more than that needs --from-run)"
        )
    else:
        decode = f"every batch decodes to the cap ({steps} tokens)"
    if g.beta > 0:
        update = "the update over every completion (beta > 0: the KL term trains on all)"
    elif load.signal_share is not None:
        update = f"the update's share of completions {given}"
    else:
        update = "the update over every completion (with beta 0 it runs only those whose group's rewards differ)"
    hint = "" if load.grpo_from else "; --from-run DIR takes both from a trial run"
    return f"{decode}; {update}{hint}"


def forward_launches(arch: Arch, update) -> float:
    """One eager forward's ops: a third of a training micro-batch's launches (plan/steptime.py: backward launches
    about twice the forward)."""
    return steptime.launches_per_micro_batch(arch, update.layout.targets, update.job.method, False, False) / 3


def forward_launch_s(arch: Arch, update, device: Device, op_s: float | None = None) -> float:
    """The per-op seconds of one eager forward: its ops at `op_s` (a GRPO fit's decode_op_s), else at the
    device's fitted seconds per launch."""
    if op_s is None:
        op_s = catalog.step_constants(constants_key(device), device.gpu.device_type).launch_s
    return forward_launches(arch, update) * op_s
