"""plan's prediction for a training config: the config's sections as plan's Job, the dataset's real lengths,
the present machine as a plan Device; `tunelab plan`, bench and the demo all use it. Torch is imported only to
probe the local device."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, replace

from .. import config as cfgmod
from ..errors import TunelabError
from ..plan import catalog, hfstack, render, workload
from ..plan.estimate import Device, Job, estimate, suggestions
from ..plan.grpo import GeneratingPlan, GrpoWorkload, Prompts, plan_grpo
from ..plan.job import STACK_ROWS, STACKS, Parts
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
    `bandwidth_bps`; with `peak_flops` given and no bandwidth, its class's catalog figure, no probe), and its
    product-call cost (an MoE model's per-expert products) from the product-call probe where the copy probe runs."""
    from ..device import cpu_class, cpu_vendor, device_memory_bytes, device_name, pick_device, pick_precision
    from ..plan.calibration import device_key, load_calibration
    from ..probe import copy_bandwidth, matmul_peak, product_call_s

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
    bandwidth, call_s = bandwidth_bps or 0.0, 0.0
    if dev.type == "cpu" and not bandwidth and peak_flops is None:
        calibrated = record is not None and record.peak_flops and record.bandwidth_bps
        bandwidth = record.bandwidth_bps if calibrated else copy_bandwidth(dev)
        call_s = product_call_s(prec.compute, dev)
    on_cpu = dev.type == "cpu"
    cls = catalog.local_class(dev.type, prec.name, cpu_class() if on_cpu else "", cpu_vendor() if on_cpu else "")
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
    return Device(gpu, overhead, record, call_s)


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
# recorded (fp32 on a 2-core EPYC capped at AVX2, 171-195 GFLOP/s, benchmarks/quickstart/quickstart_epyc-fp32-2c_2026-11-23.md).
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
    # Another tool's memory parts (plan.job.Parts fields: loss_kernel, ckpt_every, zero_stage, ...), plan --from's.
    parts: dict = field(default_factory=dict)
    price_per_hour: float | None = None  # the user's own price per GPU-hour, replacing the catalog's
    scenarios: bool = False  # also estimate SCENARIO_EXAMPLES examples of the same mean length
    # A GRPO run's (plan_generating): the decode steps and the update's share of completions, given, from a trial
    # run (plan/grpo.py grpo_workload) or their upper bounds.
    grpo: GrpoWorkload = field(default_factory=GrpoWorkload)

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

    def parts_spec(self) -> Parts:
        known = {f.name for f in dataclasses.fields(Parts)}
        unknown = sorted(set(self.parts) - known)
        if unknown:
            raise TunelabError(
                f"parts: {', '.join(unknown)}: not a memory part plan prices; one of {', '.join(sorted(known))}"
            )
        return Parts(**self.parts).check()

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
    job = Job.of(cfg, stack=r.stack, hf=r.hf_spec(), parts=r.parts_spec())
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


# The fields of a prompt row that say what its completion is, in order: the response its format trains on (alpaca's
# `output`, completion's `completion`), else the `answer` a reward checks.
COMPLETION_FIELDS = ("output", "completion", "answer")


def prompt_lengths(cfg: cfgmod.TrainConfig, r: PlanRequest) -> Prompts:
    """The prompt rows' real lengths and, where every row has a COMPLETION_FIELDS field, each one's completion in
    tokens (the field tokenized, plus EOS, capped at max_completion_length); else an assumed workload."""
    if cfg.data.given:
        from ..data.pipeline import prepare

        tokenizer = _tokenizer(cfg, r.tokenizer)
        data = prepare(cfg.data_specs()[0], tokenizer)
        mean = sum(len(p) for p in data.ids) / len(data)
        source = f"prompts {cfg.data.label}: {len(data)} kept, {data.dropped} dropped"
        field = next((f for f in COMPLETION_FIELDS if all(f in row for row in data.rows)), "")
        if not field:
            return Prompts(len(data), mean, source)
        cap = cfg.objective.grpo.max_completion_length
        ids = tokenizer([str(row[field]) for row in data.rows], add_special_tokens=False)["input_ids"]
        return Prompts(len(data), mean, source, tuple(min(len(x) + 1, cap) for x in ids), field)
    if r.examples is None:
        raise TunelabError("no workload: set data.path (prompt rows) or give --examples N [--mean-tokens M]")
    mean = r.mean_tokens or min(DEFAULT_MEAN_TOKENS, cfg.batch.seq_len // 2)
    return Prompts(r.examples, mean, f"assumed: {r.examples} prompts x {mean:g} tokens")


def plan_generating(cfg: cfgmod.TrainConfig, r: PlanRequest) -> list[GeneratingPlan]:
    """GRPO's prediction on each GPU `r` names (plan/grpo.py), over the config's prompt rows' real lengths (or the
    workload `r` assumes) and `r.grpo`'s decode steps and update share."""
    r.check_gpus()
    arch = resolve_arch(cfg.model)
    prompts = prompt_lengths(cfg, r)
    trial = r.grpo.trial
    trial_model = trial.config.model if trial is not None and trial.config is not None else cfg.model
    trial_arch = arch if trial_model == cfg.model else resolve_arch(trial_model)
    job = Job.of(cfg)
    return [plan_grpo(job, arch, prompts, r.grpo, device_for(g, cfg.compute.precision), trial_arch) for g in r.gpu_ids]
