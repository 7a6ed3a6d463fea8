"""Measured rows -> plan's step model -> the fitted constants (plan/fit.py) and how close plan comes to each row.

A `Row` is one measured optimizer step and the settings it ran at (benchmarks/plan-accuracy/rows/ holds them;
bench/fitting.py reads them). `row_job` turns a row into plan's job, `observe` into its step's
coefficients; `accuracy` predicts every row with its device in the fit and left out; `catalog_document` is the
fit as catalog/fitted.yaml stores it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .. import methods
from ..config import AdapterConfig, BatchConfig, ComputeConfig, LoraConfig, MoeConfig, RunConfig
from ..errors import TunelabError
from . import arch as archmod
from . import catalog, fit, hfstack, steptime, workload
from .arch import Arch
from .estimate import attention_work, hf_fed, stack_job, step_shape
from .job import STACK_ROWS, STACKS, Job

KINDS = tuple(fit.ASSUMED)  # cuda | cpu
# What `synthetic:` lengths name: `tunelab data synthetic`'s parameters (a suite's `data` entry, bench/suites.yaml).
SYNTHETIC = ("rows", "prompt_tokens", "response_tokens", "dist", "seed")
# Each part of a step's time, in steptime.Work.coefficients' order, as the accuracy report names it.
PARTS = ("matmul+gemm-bytes", "attention", "memory", "fixed")


@dataclass(frozen=True)
class Row:
    """One measured step. `lengths` describes the documents the run trained on: `mean:<tokens>` (all of that
    length), `span:<lo>-<hi>` (uniform), or `synthetic:<json>` (the rows `tunelab data synthetic` makes with
    those parameters, tokenized as train tokenizes them)."""

    device: str  # catalog GPU id or local CPU class (catalog.local_class): the key of fitted.yaml's devices
    kind: str  # KINDS: devices of one kind lend each other their constants
    label: str
    source: str  # the results file and row (or record, or line) it comes from
    model: str  # a model plan resolves: a catalog id, `random:<id>`, `embedded`
    method: str  # methods.REGISTRY
    micro_batch: int
    seq_len: int
    compiled: bool
    grad_ckpt: bool
    measured_s: float  # seconds per optimizer step
    peak: float  # the FLOP/s the row's step divides by: a catalog peak or the matmul probe taken with it
    bandwidth: float  # bytes/s: the catalog's, or the copy probe's
    r: int
    compute_bytes: int  # 2 (bf16) | 4 (fp32)
    packing: bool
    lengths: str
    loss_fraction: float  # positions with a target over non-padding positions
    stack: str = "tunelab"  # estimate.STACKS: tunelab, or the tuned HF Trainer + PEFT peer
    base_quant: str = "none"
    # An HF stack row's choices where they differ from the tuned peer's (hfstack.TUNED_PEER): `key=value,...`
    hf: str = ""
    fit: bool = True  # False: predicted and shown, never fitted (rows of older code)
    note: str = ""
    # An MoE row's most loaded expert's tokens over the mean's, as measured (moe.imbalance); 1: uniform.
    imbalance: float = 1.0
    # What LoRA adapted (lora.targets' presets): an MoE row's experts are most of its weights, so a run that
    # adapted the attention only is priced as that.
    targets: str = "all-linear"
    # The product-call probe taken beside the steps (probe.product_call_s, seconds); 0: the class's catalog figure
    # (catalog/calls.yaml). It prices an MoE model's per-expert products on a CPU (steptime.expert_product_calls).
    call_s: float = 0.0
    # The longest attention slot the measured code ran as explicit products on a CPU: 256 for every slot before
    # runtime.SLOT_MAX_LEN set it by compiled block and precision (2026-12-07); a newer row gives its code's value.
    slot_products_len: int = 256


@dataclass(frozen=True)
class CpuBandwidth:
    """The memory bandwidth of CPU rows measured without a copy probe, and what it is."""

    bps: float
    device: str  # the class whose machine it was measured on
    source: str


def check_row(row: Row) -> str | None:
    """What is wrong with a row's values (None: nothing), for a one-line error naming its file."""
    if row.kind not in KINDS:
        return f"kind {row.kind!r}: choose from {', '.join(KINDS)}"
    if row.method not in methods.REGISTRY:
        return f"method {row.method!r}: choose from {', '.join(methods.NAMES)}"
    if row.base_quant in methods.get(row.method).refused_base_quants:
        return f"base_quant {row.base_quant!r}: {methods.get(row.method).refusal}"
    if row.stack not in STACKS:
        return f"stack {row.stack!r}: choose from {', '.join(STACKS)}"
    if row.hf:
        try:
            row_spec(row)
        except TunelabError as e:
            return str(e)
    if row.targets not in archmod.PRESETS:
        return f"targets {row.targets!r}: choose from {', '.join(archmod.PRESETS)}"
    if not row.imbalance >= 1:
        return f"imbalance must be at least 1 (the most loaded expert over the mean one), got {row.imbalance!r}"
    if not row.call_s >= 0:
        return f"call_s must be 0 (the class's catalog figure) or a probe's seconds, got {row.call_s!r}"
    for name in (
        "micro_batch",
        "seq_len",
        "r",
        "compute_bytes",
        "measured_s",
        "peak",
        "bandwidth",
        "slot_products_len",
    ):
        if not getattr(row, name) > 0:
            return f"{name} must be positive, got {getattr(row, name)!r}"
    try:
        length_spec(row.lengths)
    except ValueError as e:
        return f"lengths {row.lengths!r}: {e}"
    return None


def length_spec(text: str) -> tuple[str, object]:
    """`mean:478.3` -> ("mean", 478.3); `span:28-57` -> ("span", (28, 57)); `synthetic:{...}` -> ("synthetic",
    the dict). ValueError names what a valid one looks like."""
    import json

    kind, _, value = text.partition(":")
    try:
        if kind == "mean":
            return kind, float(value)
        if kind == "span":
            lo, hi = (int(x) for x in value.split("-"))
            return kind, (lo, hi)
        if kind == "synthetic":
            found = json.loads(value)
            if isinstance(found, dict) and set(SYNTHETIC) <= set(found):
                return kind, found
    except (ValueError, TypeError):
        pass
    raise ValueError(f"expected mean:<tokens>, span:<lo>-<hi> or synthetic:<json with {', '.join(SYNTHETIC)}>")


def row_spec(row: Row) -> hfstack.HfStack | None:
    """An HF stack row's choices: the tuned peer's (bench/peers.py), changed by the row's `hf`."""
    if not STACK_ROWS[row.stack].hf:
        return None
    items = [x for x in row.hf.split(",") if x.strip()]
    return hfstack.parse(items, hfstack.TUNED_PEER)[0]


def row_job(row: Row) -> Job:
    """plan's job for a measured row: the one place a row becomes plan's inputs. One optimizer step of one
    micro-batch row group, LoRA on the row's targets (every linear layer by default), no dropout, checkpoints or
    evaluation. The row's compute dtype is measured, not a setting: `observe` passes its bytes."""
    return Job(
        adapter=AdapterConfig(
            method=row.method, base_quant=row.base_quant, lora=LoraConfig(r=row.r, targets=row.targets)
        ),
        batch=BatchConfig(seq_len=row.seq_len, micro_batch=row.micro_batch, packing=row.packing),
        compute=ComputeConfig(grad_ckpt=row.grad_ckpt, compile=bool(row.compiled)),
        run=RunConfig(save_total_limit=1),
        moe=MoeConfig(imbalance=row.imbalance),
        stack=row.stack,
        hf=row_spec(row),
    )


@dataclass(frozen=True)
class Observed:
    """A row's step in plan's model: the fit's observation, and the shape it was priced at."""

    row: Row
    observation: fit.Observation
    tokens_per_step: float
    nonpad_per_step: float
    keys_per_token: float
    masked_pairs: float = 0.0  # head-pairs per step through a masked attention kernel (hfstack.masked_kernel)
    moe: bool = False  # a Mixture-of-Experts model's step


def observe(row: Row, arch: Arch, lengths: np.ndarray) -> Observed:
    """The row's step (plan/steptime.py) on `lengths`, batched as train batches it: packed rows price
    attention as plan does (document-causal keys on a GPU, the slots' squares on a CPU), padded rows by each
    micro-batch's width."""
    job = stack_job(row_job(row))
    batch = job.batch
    b = workload.Batching(batch, seed=job.run.seed, products_len=row.slot_products_len)
    mean = float(lengths.mean())
    built = workload.build(workload.Lengths(len(lengths), mean, row.loss_fraction * mean, "", lengths), b, batch.epochs)
    w, feed = hf_fed(job, built)
    if feed is not None:
        keys, scored = feed.keys_per_token, feed.scored_keys_per_token
    elif batch.packing:
        keys, scored = attention_work(w, job.compute.attention, row.kind)
    else:
        keys, scored = padded_keys(lengths, b), 0.0
    shape = step_shape(job, w, keys, scored, row.compute_bytes, row.kind == "cpu")
    ridge = fit.ridge(row.kind, row.peak, row.bandwidth)
    targets = archmod.adapter_targets(arch, job.adapter.lora.targets)
    lora = job.adapter.lora
    work = steptime.work(arch, job.method, job.adapter.quant, targets, lora.r, job.compute.grad_ckpt, shape, ridge)
    call_s = row.call_s or catalog.product_call_s(row.device, row.kind)[0]
    o = fit.Observation(
        row.device,
        row.kind,
        row.label,
        row.source,
        work.coefficients(row.peak, row.bandwidth),
        row.measured_s,
        fit=row.fit and row.stack == "tunelab",
        fixed_s=work.calls * call_s,
    )
    masked = 0.0
    if job.hf is not None and job.hf.masked_kernel:
        masked = steptime.masked_head_pairs(arch, shape.tokens, keys, job.compute.grad_ckpt) * shape.micro_batches
    nonpad = w.epoch.tokens_nonpad / w.epoch.micro_batches
    return Observed(row, o, shape.tokens, nonpad, shape.keys_per_token, masked, arch.moe is not None)


def padded_keys(lengths: np.ndarray, b: workload.Batching) -> float:
    """Keys per token of padded rows: each micro-batch's width, weighted by its tokens."""
    from ..data.packing import batch_width, epoch_micro_batches

    seq_len = b.batch.seq_len
    arr = np.minimum(lengths, seq_len)
    batches = epoch_micro_batches(arr, seq_len, b.batch.micro_batch, False, np.random.default_rng([b.seed, 0]))
    widths = np.array([batch_width([int(arr[row].sum()) for row in batch], seq_len, False) for batch in batches])
    return float((widths**2).sum() / widths.sum())


def achieved_bandwidth(x: Observed, c: steptime.Constants) -> float:
    """Bytes/s the row's device moves memory-bound work at under constants `c`."""
    return x.row.bandwidth * c.bandwidth


def stack_ratios(observed: list[Observed], fits: dict[str, fit.DeviceFit]) -> dict[str, dict[str, tuple]]:
    """Per peer stack, each of its rows' bytes per masked head-pair: what its step takes beyond plan's parts (its
    device in the fit), at the device's achieved bandwidth, over the head-pairs its masked kernel passes over:
    label + device -> (device, kind, bytes). Rows without a masked kernel have nothing to tell; nor have an MoE
    model's, whose excess holds its experts' dispatch (the peer's router, permutation and per-expert products)
    beside the masked kernel's bytes. Keyed by label and device, so a row measured again under the same label
    on the same device counts once, as its last."""
    ratios: dict[str, dict[str, tuple]] = {s: {} for s in STACKS if s != "tunelab"}
    for x in observed:
        if x.row.stack != "tunelab" and x.masked_pairs > 0 and not x.moe:
            o, c = x.observation, fits[x.observation.device].included.constants
            excess = o.measured_s - fit.predict_s(c, o.coefficients, o.fixed_s)
            per_pair = excess * achieved_bandwidth(x, c) / x.masked_pairs
            ratios[x.row.stack][x.row.label + x.row.device] = (x.row.device, x.row.kind, per_pair)
    return ratios


def kind_pair_bytes(found: dict[str, tuple], kind: str, leave_out: str = "") -> float:
    """A peer stack's bytes per masked head-pair on one kind of device (cuda | cpu), the mean over its rows on
    that kind (without device `leave_out`'s); 0 where no other row of the kind tells: a GPU's and a CPU's masked
    kernels are different code, so one kind's figure says nothing of the other's."""
    seen = [v for dev, k, v in found.values() if k == kind and dev != leave_out]
    return fit.pair_bytes(seen or [0.0])


@dataclass(frozen=True)
class Accuracy:
    """plan's prediction of one row with its device in the fit and left out of it."""

    observed: Observed
    predicted_in: float
    predicted_out: float
    breakdown_in: dict[str, float]  # seconds per part with the device in the fit

    def as_dict(self) -> dict:
        x, measured = self.observed, self.observed.row.measured_s
        return {
            **asdict(x.row),
            "tokens_per_step": x.tokens_per_step,
            "nonpad_per_step": x.nonpad_per_step,
            "keys_per_token": x.keys_per_token,
            "predicted_s_in": self.predicted_in,
            "error_in": self.predicted_in / measured - 1,
            "predicted_s_out": self.predicted_out,
            "error_out": self.predicted_out / measured - 1,
            "breakdown_in": self.breakdown_in,
        }


def accuracy(observed: list[Observed], fits: dict[str, fit.DeviceFit], ratios: dict[str, dict]) -> list[Accuracy]:
    """Every row predicted in and out of the fit; a peer stack's rows with its masked kernel's bytes per
    head-pair from its rows (left out: from those of the other devices)."""
    out = []
    for x in observed:
        o, device = x.observation, x.row.device
        predicted = []
        for c, left_out in ((fits[device].included.constants, False), (fits[device].left_out.constants, True)):
            pred = fit.predict_s(c, o.coefficients, o.fixed_s)
            if x.masked_pairs:
                per_pair = kind_pair_bytes(ratios[x.row.stack], x.row.kind, device if left_out else "")
                pred += x.masked_pairs * per_pair / achieved_bandwidth(x, c)
            predicted.append(pred)
        part = np.array(o.coefficients) * fit.to_x(fits[device].included.constants)
        part[PARTS.index("fixed")] += o.fixed_s
        out.append(Accuracy(x, predicted[0], predicted[1], dict(zip(PARTS, part.round(5).tolist()))))
    return out


def catalog_document(
    observed: list[Observed], fits: dict[str, fit.DeviceFit], ratios: dict[str, dict], cpu: CpuBandwidth | None
) -> dict:
    """catalog/fitted.yaml's content: each device with fitted rows (its constants, which of them its rows
    determine, the rows), each CPU class's constants pooled over its vendors' devices, each kind's pooled over its
    devices, each peer stack's bytes per masked head-pair."""
    kind_of = {x.row.device: x.row.kind for x in observed}
    devices = {}
    for device, f in ((d, v.included) for d, v in fits.items()):
        if not f.rows:
            continue
        entry = {"kind": kind_of[device], "constants": rounded(f.constants), "measured": list(f.measured)}
        entry["rows"] = list(f.rows)
        if kind_of[device] == "cpu":
            entry |= cpu_bandwidth_entry(device, observed, cpu)
        devices[device] = entry
    kinds = {}
    for kind in KINDS:  # a kind without measured rows keeps plan/fit.py's assumed constants
        c, used = fit.pooled([x.observation for x in observed], kind)
        kinds[kind] = {"constants": rounded(c), "devices": list(used)}
    # Each CPU class over its measured vendors: for a vendor (or a CPU whose vendor is unknown) without rows.
    classes = {}
    for family in dict.fromkeys(fit.cpu_class_of(d) for d in devices):
        if family:
            c, used = fit.pooled([x.observation for x in observed], "cpu", within=family)
            classes[family] = {"constants": rounded(c), "devices": list(used)}
    stacks = {
        stack: {
            "masked_pair_bytes": {kind: float(f"{kind_pair_bytes(found, kind):.4g}") for kind in KINDS},
            "rows": [x.row.source for x in observed if x.row.stack == stack and not x.moe],
        }
        for stack, found in ratios.items()
    }
    return {"devices": devices, "classes": classes, "kinds": kinds, "stacks": stacks}


def cpu_bandwidth_entry(device: str, observed: list[Observed], cpu: CpuBandwidth | None) -> dict:
    """A CPU class's bandwidth where plan runs no copy probe: the median of the copy probes its fitted rows ran
    against where any row has its own (its machine's, never another's), else the row files' `cpu_bandwidth`, named
    as carried where another class measured it; nothing without either."""
    own = [x.row.bandwidth for x in observed if x.row.device == device and x.observation.fit]
    if own and (cpu is None or any(b != cpu.bps for b in own)):
        n = len(own)
        source = f"median copy probe of its {n} fitted row{'s' * (n > 1)}, each its own machine's"
        return {"bandwidth_gbs": float(f"{float(np.median(own)) / 1e9:.4g}"), "bandwidth_source": source}
    if cpu is None:
        return {}
    carried = "" if device == cpu.device else f"; carried from class {cpu.device}"
    return {"bandwidth_gbs": cpu.bps / 1e9, "bandwidth_source": cpu.source + carried}


def rounded(c: steptime.Constants) -> dict[str, float]:
    """Constants to 4 significant digits: the fit's precision, not its noise."""
    return {k: float(f"{x:.4g}") for k, x in asdict(c).items()}
