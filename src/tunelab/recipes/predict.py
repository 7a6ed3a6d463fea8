"""plan's prediction for a training config: the config's sections as plan's Job, the dataset's real lengths,
the present machine as a plan Device; `tunelab plan`, bench and the demo all use it. Torch is imported only to
probe the local device."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import config as cfgmod
from ..errors import TunelabError
from ..plan import catalog, hfstack, render, steptime, timing, workload
from ..plan.estimate import Device, Job, compute_bytes, estimate, suggestions
from ..plan.generation import GrpoStep, generation
from ..plan.job import STACK_ROWS, STACKS
from ..runtime import CompileChoice
from ..sources import resolve_arch


def _tokenizer(cfg: cfgmod.TrainConfig, tokenizer_ref: str | None):
    from .. import sources

    try:
        return sources.load_tokenizer(sources.resolve(tokenizer_ref or cfg.model, weights=False))
    except TunelabError as e:
        raise TunelabError(
            f"{e} (plan needs the tokenizer to measure data.path; pass --tokenizer MODEL to measure with another local one)"
        ) from None


def dataset_lengths(cfg: cfgmod.TrainConfig, tokenizer_ref: str | None) -> workload.Lengths:
    """Real lengths after the template and truncation, from the same pipeline (and cache) `train` uses; the
    evaluation examples (eval.split or eval.path) split off exactly as `train` splits them."""
    from ..data.pipeline import prepare_split

    data, held = prepare_split(*cfg.data_specs(), _tokenizer(cfg, tokenizer_ref))
    proxy = f", tokenized with {tokenizer_ref}'s tokenizer" if tokenizer_ref else ""
    source = f"dataset {cfg.data.label}: {data.stats.rows} rows, {data.stats.truncated} truncated, {data.stats.dropped} dropped{proxy}"
    if held is not None:
        where = "held out (eval.split)" if cfg.eval.path is None else f"from {cfg.eval.path}"
        source += f"; evaluation: {held.stats.examples} examples {where}"
    return _lengths(data, source, None if held is None else _lengths(held, "evaluation examples", None))


def _lengths(data, source: str, held_out: workload.Lengths | None) -> workload.Lengths:
    st = data.stats
    return workload.Lengths(
        st.examples,
        st.mean_len,
        st.tokens_loss / st.examples,
        source=source,
        lengths=data.lengths,
        truncated=st.truncated,
        dropped=st.dropped,
        held_out=held_out,
    )


def eval_file_lengths(cfg: cfgmod.TrainConfig, tokenizer_ref: str | None) -> workload.Lengths:
    """eval.path's real lengths, for a plan whose training examples are assumed (no data.path)."""
    from ..data.pipeline import eval_file_spec, prepare

    spec = eval_file_spec(cfg.data_specs()[0], cfg.eval.path, cfg.eval.max_rows)
    return _lengths(prepare(spec, _tokenizer(cfg, tokenizer_ref)), f"evaluation examples from {cfg.eval.path}", None)


def local_device(precision: str, peak_flops: float | None = None, bandwidth_bps: float | None = None) -> Device:
    """The present machine: its peak from a calibration record, else a short matmul probe (or `peak_flops`,
    given, with no probe). A CPU's memory bandwidth likewise: the record's, else a copy probe (or
    `bandwidth_bps`; with `peak_flops` given and no bandwidth, its class's catalog figure, no probe)."""
    from ..device import cpu_class, device_memory_bytes, device_name, pick_device, pick_precision
    from ..plan.calibration import device_key, load_calibration
    from ..probe import copy_bandwidth, matmul_peak

    dev = pick_device("auto")
    prec = pick_precision(precision, dev)
    name = device_name(dev)
    record = load_calibration(device_key(name))
    memory = device_memory_bytes(dev)
    row = catalog.match_gpu(name, memory) if dev.type == "cuda" else None
    if peak_flops is not None:
        peak, source = peak_flops, "a floor for the device type, not measured"
    elif record is not None and record.peak_flops:
        peak, source = record.peak_flops, f"calibration record {record.created}"
    elif row is not None:
        # The fitted step constants are fractions of the datasheet peak (plan/fit.py), as bench's MFU is: a
        # probed peak (790 of 989 TFLOP/s on an H200) put plan 25-31% under the measured rates.
        peak, source = row.peak_flops, f"catalog row {row.id}"
    else:
        peak, n = matmul_peak(prec.compute, dev)
        source = f"measured now: {n}^3 {prec.name} matmul probe"
    bandwidth = bandwidth_bps or 0.0
    if dev.type == "cpu" and not bandwidth and peak_flops is None:
        calibrated = record is not None and record.peak_flops and record.bandwidth_bps
        bandwidth = record.bandwidth_bps if calibrated else copy_bandwidth(dev)
    cls = catalog.local_class(dev.type, prec.name, cpu_class() if dev.type == "cpu" else "")
    overhead = catalog.runtime_overhead("cuda" if dev.type == "cuda" else "cpu")
    if record is not None and record.runtime_overhead_bytes is not None:
        overhead = record.runtime_overhead_bytes
    gpu = catalog.Gpu(
        "local",
        name,
        memory,
        row.bandwidth_gbs if row else bandwidth / 1e9,
        peak,
        prec.name == "bf16",
        cls,
        source=source,
        peak_source=source,
        catalog_id=row.id if row else "",
    )
    return Device(gpu, overhead, record)


def local_prediction(
    cfg: cfgmod.TrainConfig,
    peak_flops: float | None = None,
    calibrated: bool = True,
    bandwidth_bps: float | None = None,
):
    """plan's estimate for a training config on the present device, as `plan --gpu local` computes it: what
    `bench` and the demo put beside their measurements. `peak_flops`, `bandwidth_bps` and `calibrated=False`:
    the step model's own figures at a given peak and bandwidth, which `bench calibrate` compares its
    measurement with."""
    arch = resolve_arch(cfg.model)
    device = local_device(cfg.compute.precision, peak_flops, bandwidth_bps)
    if not calibrated:
        device = replace(device, calibration=None)
    return estimate(arch, dataset_lengths(cfg, None), Job.of(cfg), device)


# The slowest matmul rate a device of each type is assumed to reach (FLOP/s): an upper bound on a run's eager
# time, below which `compile: auto` can decide without probing the device. cpu: under the slowest probe
# recorded (fp32 on a 2-core EPYC capped at AVX2, 171-195 GFLOP/s, benchmarks/quickstart_epyc-fp32-2c_2026-11-23.md).
FLOOR_PEAK_FLOPS = {"cpu": 1e11, "cuda": 1e13}


def run_compile_choice(cfg: cfgmod.TrainConfig, data) -> CompileChoice:
    """How a run resolves `compile` (runtime.compile_choice, through plan's estimate, as `tunelab plan --gpu
    local` does): `data` is the run's tokenized training data. A run too short to pay for compiling even at
    the device type's floor rate decides without the matmul probe."""
    from ..runtime import compile_choice

    if isinstance(cfg.compute.compile, bool):
        return compile_choice(cfg.compute.compile, "", None, 0.0, 1.0)
    from ..device import pick_device

    try:
        arch = resolve_arch(cfg.model)
    except TunelabError:  # plan cannot read this model's architecture: no prediction, so no compile
        return compile_choice(cfg.compute.compile, pick_device(cfg.compute.device).type, None, 0.0, 1.0)
    lengths = _lengths(data, "the run's training data", None)
    floor = local_device(cfg.compute.precision, FLOOR_PEAK_FLOPS.get(pick_device(cfg.compute.device).type, 1e13))
    quick = estimate(arch, lengths, Job.of(cfg), floor)
    if not quick.compile_choice.chosen:
        return quick.compile_choice
    device = local_device(cfg.compute.precision)
    return estimate(arch, lengths, Job.of(cfg), device).compile_choice


DEFAULT_GPU = "h100-sxm"
# Without a dataset: every example is assumed this many tokens long, half of them with a loss target.
# Printed as assumptions; give data.path for real lengths.
DEFAULT_MEAN_TOKENS = 256
DEFAULT_LOSS_FRACTION = 0.5
SHARDINGS = ("ddp", "zero2", "zero3")
SCENARIO_EXAMPLES = (10_000, 50_000, 100_000)


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """What `tunelab plan` asks beside the config: which GPUs, the workload when there is no dataset, the stack,
    the price. The CLI's flags and `tunelab.estimate()`'s keywords fill it."""

    gpu: str | list[str] = DEFAULT_GPU  # catalog ids (comma-separated or a list) or `local`
    gpus: int = 1  # GPUs per run: >1 adds DDP / ZeRO-2 / ZeRO-3 estimates
    examples: int | None = None  # training examples when the config names no dataset
    mean_tokens: float | None = None  # their assumed mean length (default 256 or seq_len if shorter)
    loss_fraction: float = DEFAULT_LOSS_FRACTION  # the assumed share of their tokens with a loss target
    tokenizer: str | None = None  # a local model whose tokenizer measures data.path when the model is not local
    stack: str = "tunelab"  # plan.job.STACKS
    # An HF stack's choices by their TrainingArguments names (`--hf KEY=VALUE`, plan/hfstack.py): KEY=VALUE items
    # or a mapping; those that are tunelab settings reach the config before this request is made.
    hf: list[str] | dict = field(default_factory=list)
    price_per_hour: float | None = None  # the user's own price per GPU-hour, replacing the catalog's
    scenarios: bool = False  # also estimate SCENARIO_EXAMPLES examples of the same mean length
    # A GRPO run's (plan_generating): the decode steps of a generation batch, which run until its longest
    # completion stops (default max_completion_length, an upper bound), and the share of completions whose
    # group's rewards differ, the only ones the update runs with beta 0 (default 1, an upper bound). A short
    # trial run measures both: `grpo_trial`.
    completion_tokens: float | None = None
    signal_share: float | None = None
    grpo_from: str | None = None  # where those two come from (a trial run's folder), for plan's text
    # That trial run's measured times: on `--gpu local` (the machine it ran on) they scale plan's sampling and
    # update rates to this machine's (`trial_rates`).
    trial: GrpoTrial | None = None

    @property
    def gpu_ids(self) -> list[str]:
        given = self.gpu.split(",") if isinstance(self.gpu, str) else list(self.gpu)
        return [g.strip() for g in given if g.strip()]

    def check_gpus(self) -> None:
        if self.gpus < 1:
            raise TunelabError(f"--gpus must be at least 1, got {self.gpus}")
        if not self.gpu_ids:
            raise TunelabError("--gpu is empty; name catalog ids like h100-sxm,rtx-4090 or `local`")
        if self.stack not in STACKS:
            raise TunelabError(f"stack must be one of {', '.join(STACKS)}; got {self.stack!r}")
        if self.hf and not STACK_ROWS[self.stack].hf:
            raise TunelabError(
                f"--hf describes an HF Trainer + PEFT script; add --stack hf-peft (got --stack {self.stack})"
            )
        self.hf_spec()  # bad choices fail here, naming the key

    def hf_spec(self) -> hfstack.HfStack | None:
        return hfstack.parse(self.hf)[0] if STACK_ROWS[self.stack].hf else None
        for g in self.gpu_ids:
            if g != "local":
                catalog.gpu(g)


def plan_config(cfg: cfgmod.TrainConfig, r: PlanRequest) -> list[render.Result]:
    """plan's prediction for `cfg` on each GPU `r` names: one GPU, the sharded runs over `r.gpus`, single-knob
    suggestions, prices, and with `r.scenarios` other dataset sizes. What `tunelab plan` prints and
    `tunelab.estimate()` returns."""
    if cfg.objective.row.generates:
        raise TunelabError(
            f"objective {cfg.objective.name}: plan predicts a generating run with plan_generating (the CLI does); "
            "this table is for sft, dpo and orpo"
        )
    r.check_gpus()
    # The local probe measures this machine in the run's own precision (fp16 on a CPU fails as train fails).
    devices = [device_for(g, cfg.compute.precision) for g in r.gpu_ids]
    if r.gpus > 1 and any(d.gpu.device_type == "cpu" for d in devices):
        raise TunelabError(
            f"--gpus {r.gpus} with --gpu local on a CPU: the processes would share this machine's cores, so "
            "nothing scales; --gpus predicts several GPUs (name catalog ids)"
        )
    arch = resolve_arch(cfg.model)
    lengths = workload_lengths(cfg, r)
    job = Job.of(cfg, stack=r.stack, hf=r.hf_spec())
    results = []
    for device in devices:
        single = estimate(arch, lengths, job, device)
        multi = []
        if r.gpus > 1:
            # FSDP (fsdp2.yaml, the zero3 row) shards floating-point weights only: no zero3 over an nf4/int8 base.
            for strategy in SHARDINGS if cfg.adapter.quant == "none" else SHARDINGS[:2]:
                multi.append(
                    estimate(arch, lengths, job, device, r.gpus, strategy, catalog.scaling_efficiency(strategy))
                )
        scenarios = (
            [(n, estimate(arch, scaled(lengths, n), job, device)) for n in SCENARIO_EXAMPLES] if r.scenarios else None
        )
        prices = price_rows(device.gpu.id, r.price_per_hour)
        # Beside an HF script's prediction, tunelab's own run of the same config: what it would save.
        own = estimate(arch, lengths, job.but(stack="tunelab", hf=None), device) if job.hf is not None else None
        results.append(
            render.Result(arch, single, multi, suggestions(arch, lengths, single), prices, scenarios, tunelab=own)
        )
    return results


def workload_lengths(cfg: cfgmod.TrainConfig, r: PlanRequest) -> workload.Lengths:
    """The dataset's real lengths (data.path), else `r.examples` examples of an assumed mean length."""
    if cfg.data.given:
        if r.examples is not None or r.mean_tokens is not None:
            raise TunelabError(
                "--examples/--mean-tokens describe a dataset you do not have; data.path is set, drop them (or set data.path=null)"
            )
        return dataset_lengths(cfg, r.tokenizer)
    if r.examples is None:
        raise TunelabError("no workload: set data.path (real token lengths) or give --examples N [--mean-tokens M]")
    if r.examples < 1:
        raise TunelabError(f"--examples must be at least 1, got {r.examples}")
    # The default assumption fits the run's rows: a shorter seq_len is read as shorter examples, not truncation.
    mean = min(DEFAULT_MEAN_TOKENS, cfg.batch.seq_len) if r.mean_tokens is None else r.mean_tokens
    if not 1 <= mean < math.inf:  # written so that nan, which compares false, fails too
        raise TunelabError(f"--mean-tokens must be at least 1, got {mean}")
    if not 0 < r.loss_fraction <= 1:
        raise TunelabError(f"--loss-fraction must be in (0, 1], got {r.loss_fraction}")
    assumed = workload.assumed_lengths(r.examples, mean, r.loss_fraction)
    if cfg.eval.split is not None:
        return workload.split_assumed(assumed, cfg.eval.split)
    if cfg.eval.path is not None:
        return replace(assumed, held_out=eval_file_lengths(cfg, r.tokenizer))
    return assumed


def device_for(gpu_id: str, precision: str) -> Device:
    """A catalog GPU, or this machine (`local`) measured in the run's own precision."""
    if gpu_id != "local":
        return Device(catalog.gpu(gpu_id), catalog.runtime_overhead("cuda"))
    return local_device(precision)


def price_rows(gpu_id: str, override: float | None) -> list[catalog.Price]:
    if override is not None:
        if not 0 < override < math.inf:
            raise TunelabError(f"--price-per-hour must be a positive number, got {override}")
        return [catalog.Price("user", gpu_id, override, 1, "given", "--price-per-hour")]
    return catalog.prices(gpu_id)


def scaled(lengths: workload.Lengths, examples: int) -> workload.Lengths:
    """The same mean example (and loss share) at another dataset size, for the md scenarios."""
    return workload.Lengths(
        examples,
        lengths.mean_tokens,
        lengths.mean_loss_tokens,
        source=f"{examples} examples of the mean length {lengths.mean_tokens:.1f}",
        held_out=lengths.held_out,
    )


@dataclass(frozen=True)
class GeneratingPlan:
    """plan's prediction of a GRPO run on one device: a generation batch by part, the batches, the memory."""

    device: str
    prompts: int
    prompt_tokens: float
    step: GrpoStep
    batches: int  # generation batches in the run
    memory_bytes: int  # the update's memory (plan/memory.py) plus the KV cache of every sampled row
    source: str
    # The schedule's batches where `max_minutes` ends the run before them (then `batches` are those that run); 0
    # when it does not.
    time_limited_from: int = 0
    assumption: str = ""  # the decode steps and the update's share: where each comes from
    # grpo.schedule_within_limit: the run's learning-rate schedule ends with the batches that fit, not the schedule's.
    schedule_fitted: bool = False

    @property
    def time_s(self) -> float:
        return self.batches * self.step.batch_s


def prompt_lengths(cfg: cfgmod.TrainConfig, r: PlanRequest) -> tuple[int, float, str]:
    """(prompts, their mean tokens, where that comes from): the prompt rows' real lengths, else assumed."""
    if cfg.data.given:
        from ..data.pipeline import prepare

        data = prepare(cfg.data_specs()[0], _tokenizer(cfg, r.tokenizer))
        mean = sum(len(p) for p in data.ids) / len(data)
        return len(data), mean, f"prompts {cfg.data.label}: {len(data)} kept, {data.dropped} dropped"
    if r.examples is None:
        raise TunelabError("no workload: set data.path (prompt rows) or give --examples N [--mean-tokens M]")
    mean = r.mean_tokens or min(DEFAULT_MEAN_TOKENS, cfg.batch.seq_len // 2)
    return r.examples, mean, f"assumed: {r.examples} prompts x {mean:g} tokens"


@dataclass(frozen=True)
class GrpoTrial:
    """What a GRPO run measured that plan otherwise assumes at its upper bound (PlanRequest's fields), and its
    times: the median batch's sampling and the rest of it (rewards, scoring passes, update)."""

    completion_tokens: float  # the median over generation batches of the longest completion: the decode steps
    signal_share: float  # the mean share of completions the update ran on
    batches: int
    generation_s: float = 0.0  # the median batch's sampling seconds
    rest_s: float | None = None  # the median batch's seconds after sampling, from the second batch on (None: one)
    config: cfgmod.TrainConfig | None = None  # the run's config.yaml: the batch shape those times are for


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


def grpo_workload(completion_tokens=None, signal_share=None, from_run=None) -> dict:
    """PlanRequest's GRPO fields from the values given, or from a trial run's folder (`from_run`) when named."""
    if from_run is None:
        return {"completion_tokens": completion_tokens, "signal_share": signal_share}
    trial = grpo_trial(from_run)
    return {
        "completion_tokens": trial.completion_tokens,
        "signal_share": trial.signal_share,
        "grpo_from": f"{from_run} ({trial.batches} generation batches)",
        "trial": trial,
    }


def plan_generating(cfg: cfgmod.TrainConfig, r: PlanRequest) -> list[GeneratingPlan]:
    """GRPO's prediction on each GPU `r` names (plan/generation.py): sampling from the model's bytes, KV bytes
    and FLOPs per decode step, the scoring passes and the update from plan's step model over rows of prompt plus
    completion. Each batch's decode runs `r.completion_tokens` steps (default max_completion_length) and, with
    beta 0, the update runs over `r.signal_share` of the completions (default all)."""
    g, b = cfg.objective.grpo, cfg.batch
    arch = resolve_arch(cfg.model)
    prompts, mean, source = prompt_lengths(cfg, r)
    steps = min(r.completion_tokens or g.max_completion_length, g.max_completion_length)
    share = 1.0 if g.beta > 0 or r.signal_share is None else r.signal_share
    if not 0 < steps or not 0 <= share <= 1:
        raise TunelabError(
            f"completion tokens must be above 0 and the signal share within 0-1; got {steps:g} and {share:g}"
        )
    length = mean + steps
    assumption = _grpo_assumption(g, r, steps)
    lengths = workload.Lengths(prompts * g.num_generations, length, float(steps), source=source)
    per_batch = b.micro_batch * b.grad_accum
    batches = math.ceil(b.max_steps / g.num_iterations) if b.max_steps else math.ceil(b.epochs * prompts / per_batch)
    out = []
    for gpu_id in r.gpu_ids:
        device = device_for(gpu_id, cfg.compute.precision)
        step, update = grpo_step(cfg, arch, mean, steps, share, lengths, device)
        rates = trial_rates(r.trial, cfg, arch, mean, lengths, device) if gpu_id == "local" else None
        if rates:
            step = scaled_step(step, *rates)
            assumption += f"; this machine's rates from the trial: sampling x{rates[0]:.2f}, the rest x{rates[1]:.2f}"
        memory = update.memory.total + step.generation.kv_cache_bytes
        # The run checks its time limit between generation batches (recipes/grpo.py), as the loop between steps.
        runs = timing.steps_within(cfg.run.max_minutes * 60, batches, batches * step.batch_s, 0.0)
        limited = batches if runs < batches else 0
        out.append(
            GeneratingPlan(
                device.gpu.name,
                prompts,
                mean,
                step,
                runs,
                memory,
                source,
                limited,
                assumption,
                g.schedule_within_limit,
            )
        )
    return out


def grpo_step(cfg: cfgmod.TrainConfig, arch, mean: float, steps: float, share: float, lengths, device: Device):
    """(one generation batch and its optimizer steps by part, plan's estimate of the update) on `device`, for
    `steps` decode steps and the update over `share` of the completions."""
    g, b = cfg.objective.grpo, cfg.batch
    job = Job.of(cfg).but(micro_batch=b.micro_batch * g.num_generations, packing=False, compile=False, max_steps=1)
    update = estimate(arch, lengths, job, device)
    gpu = device.gpu
    bandwidth = gpu.bandwidth_gbs * 1e9 or catalog.nearest_bandwidth(gpu.peak_flops)
    fit = catalog.grpo_constants(device_key(device))
    overhead = forward_launch_s(arch, update, device, fit.decode_op_s if fit else None)
    gen = generation(
        arch,
        b.micro_batch * b.grad_accum * g.num_generations,
        mean,
        steps,
        compute_bytes(job, device),
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


def trial_rates(trial, cfg: cfgmod.TrainConfig, arch, mean: float, lengths, device: Device):
    """(sampling, the rest) measured over predicted for a trial run's own batch on this machine, or None without
    its times: the factors that turn plan's rates for this machine into the ones the trial measured. The trial's
    batch shape is its config.yaml's (this config's where it has none), its prompts this config's."""
    if trial is None or trial.rest_s is None:
        return None
    tcfg = trial.config or cfg
    tarch = arch if tcfg.model == cfg.model else resolve_arch(tcfg.model)
    tsteps = min(trial.completion_tokens, tcfg.objective.grpo.max_completion_length)
    tshare = 1.0 if tcfg.objective.grpo.beta > 0 else trial.signal_share
    tlengths = replace(lengths, mean_tokens=mean + tsteps, mean_loss_tokens=float(tsteps))
    predicted, _ = grpo_step(tcfg, tarch, mean, tsteps, tshare, tlengths, device)
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


def _grpo_assumption(g: cfgmod.GrpoConfig, r: PlanRequest, steps: float) -> str:
    """plan's text on where a GRPO plan's decode steps and update share come from."""
    given = f"from {r.grpo_from}" if r.grpo_from else "given"
    decode = f"the decode steps {given}" if r.completion_tokens else f"every batch decodes to the cap ({steps} tokens)"
    if g.beta > 0:
        update = "the update over every completion (beta > 0: the KL term trains on all)"
    elif r.signal_share is not None:
        update = f"the update's share of completions {given}"
    else:
        update = "the update over every completion (with beta 0 it runs only those whose group's rewards differ)"
    hint = "" if r.grpo_from else "; --from-run DIR takes both from a trial run"
    return f"{decode}; {update}{hint}"


def device_key(device: Device) -> str:
    """The key a device's fitted constants are filed under: its catalog id, or a local machine's class."""
    gpu = device.gpu
    return gpu.catalog_id or (gpu.device_class if gpu.id == "local" else gpu.id)


def forward_launches(arch, update) -> float:
    """One eager forward's ops: a third of a training micro-batch's launches (plan/steptime.py: backward launches
    about twice the forward)."""
    return steptime.launches_per_micro_batch(arch, update.layout.targets, update.job.method, False, False) / 3


def forward_launch_s(arch, update, device: Device, op_s: float | None = None) -> float:
    """The per-op seconds of one eager forward: its ops at `op_s` (a GRPO fit's decode_op_s), else at the
    device's fitted seconds per launch."""
    if op_s is None:
        op_s = catalog.step_constants(device_key(device), device.gpu.device_type).launch_s
    return forward_launches(arch, update) * op_s
