"""The catalog files (GPUs, prices, model architectures): YAML data shipped with the package.

Code never hard-codes a GPU's peak; it reads these rows and carries their `source` into the output.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml

from ..errors import TunelabError


@cache
def read(name: str) -> dict:
    return yaml.safe_load(resources.files("tunelab.plan").joinpath("catalog", name).read_text())


@dataclass(frozen=True)
class Gpu:
    id: str
    name: str
    memory_bytes: int
    bandwidth_gbs: float
    peak_flops: float  # dense 16-bit tensor FLOP/s (GeForce: FP32 accumulate)
    bf16: bool
    device_class: str
    source: str
    note: str = ""
    # Where the peak came from when it is not a catalog row (the `local` probe).
    peak_source: str = "catalog"
    # The catalog row a local GPU's name matched (match_gpu): its bandwidth and fitted step constants apply.
    catalog_id: str = ""

    @property
    def device_type(self) -> str:
        """`cpu` for the local CPU's classes (cpu, cpu-avx512-bf16, cpu-fp32), else `cuda`."""
        return "cpu" if self.device_class.startswith("cpu") else "cuda"


@dataclass(frozen=True)
class Price:
    provider: str
    gpu: str
    price_per_hour: float  # for the whole instance
    gpus_per_instance: int
    date: str
    source: str

    def instances(self, gpus: int) -> int:
        """Instances are rented whole: a 1-GPU run on an 8-GPU instance pays for all 8."""
        return -(-gpus // self.gpus_per_instance)


def unknown(kind: str, name: str, known: list[str]) -> TunelabError:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return TunelabError(f"unknown {kind} {name!r}{hint}; known: {', '.join(known)}")


def gpu_ids() -> list[str]:
    return list(read("gpus.yaml")["gpus"])


def gpu(gpu_id: str) -> Gpu:
    rows = read("gpus.yaml")["gpus"]
    if gpu_id not in rows:
        raise unknown("GPU", gpu_id, gpu_ids() + ["local"])
    row = rows[gpu_id]
    return Gpu(
        id=gpu_id,
        name=row["name"],
        memory_bytes=int(row["memory_mib"] * 2**20) if "memory_mib" in row else int(row["memory_gib"] * 2**30),
        bandwidth_gbs=float(row["bandwidth_gbs"]),
        peak_flops=float(row["bf16_tflops"]) * 1e12,
        bf16=bool(row["bf16"]),
        device_class=row["class"],
        source=row["source"],
        note=row.get("note", ""),
    )


# Name tokens that mark a variant NVIDIA's driver spells out in the device name ("NVIDIA H100 PCIe",
# "NVIDIA H100 NVL"); a device name without them is the SXM/default part.
VARIANT_TOKENS = {"pcie", "nvl", "pro"}


def _tokens(name: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", name.lower()))


def match_gpu(name: str, memory_bytes: int) -> Gpu | None:
    """The catalog row for a CUDA device name as torch reports it, or None when no row fits.

    A row fits when every name token with a digit (model number, memory size) appears in the device name and
    both name the same variant tokens (PCIe, NVL, PRO); among fitting rows the closest memory size wins
    ('NVIDIA A100-SXM4-80GB' -> a100-80gb, 'NVIDIA H100 80GB HBM3' -> h100-sxm).
    """
    have = _tokens(name)
    fits = []
    for gpu_id in gpu_ids():
        row = gpu(gpu_id)
        want = _tokens(row.name)
        numbered = {t for t in want if any(c.isdigit() for c in t)}
        if numbered and numbered <= have and want & VARIANT_TOKENS == have & VARIANT_TOKENS:
            fits.append(row)
    if not fits:
        return None
    return min(fits, key=lambda g: abs(g.memory_bytes - memory_bytes))


def nearest_bandwidth(peak_flops: float) -> float:
    """Bytes/s of the catalog GPU whose dense peak is nearest `peak_flops`: the stand-in for an unlisted GPU's
    memory bandwidth, which no probe measures (plan says the constants are carried over for it)."""
    rows = [gpu(i) for i in gpu_ids()]
    return min(rows, key=lambda g: abs(g.peak_flops - peak_flops)).bandwidth_gbs * 1e9


# The vendors a CPU class is split by (device.cpu_vendor): AVX-512 BF16 and AVX2 run on Intel and AMD cores alike,
# and the same probes stand for different steps on each (benchmarks/plan-accuracy/
# cpu-calibration_epyc-avx512bf16-2c_2026-12-08.md: one constant for a Xeon and an EPYC missed the EPYC by 32%).
# AMX (class `cpu`) is Intel's alone.
CPU_VENDORS = ("intel", "amd")


def local_class(device_type: str, precision: str, cpu: str, vendor: str = "") -> str:
    """The class of the present machine for `plan --gpu local`: `probe-gpu` on CUDA; on a CPU, by what does the
    matmuls (`cpu` is device.cpu_class()): `cpu-fp32` when training computes in fp32, `cpu-avx512-bf16` for
    bf16 on AVX-512 BF16 dot products, else `cpu` (AMX tiles, or bf16 that is only emulated); the first two
    followed by the CPU's vendor where it is known (`cpu-avx512-bf16-amd`). A CPU class keys its step-time
    constants in fitted.yaml: each is relative to the same probes bench divides by, and differs because the probe
    and a small model's matmuls reach different shares of each kind of unit, on each vendor's cores."""
    if device_type == "cuda":
        return "probe-gpu"
    if precision != "bf16":
        base = "cpu-fp32"
    elif cpu == "avx512-bf16":
        base = "cpu-avx512-bf16"
    else:
        return "cpu"
    return f"{base}-{vendor}" if vendor in CPU_VENDORS else base


def class_chain(device: str) -> tuple[str, ...]:
    """The catalog keys a device's rows are looked up by, most specific first: a vendor's CPU class, then the class
    over all vendors (`cpu-avx512-bf16-amd` -> itself, `cpu-avx512-bf16`); any other device alone."""
    base, _, vendor = device.rpartition("-")
    if device.startswith("cpu-") and vendor in CPU_VENDORS:
        return device, base
    return (device,)


def runtime_overhead(device_type: str) -> int:
    """Bytes a training process holds beyond the memory model's terms on a `device_type` (cuda | cpu)."""
    return round(float(read("gpus.yaml")["runtime-overhead-gib"][device_type]) * 2**30)


def freed_pages_held(device_type: str) -> int:
    """Bytes of the runtime overhead that are freed pages the allocator holds at a peak inside backward, on a
    `device_type` that returns them before an optimizer step with scratch (0 where the catalog has no figure)."""
    return round(float(read("gpus.yaml")["freed-pages-held-gib"].get(device_type, 0.0)) * 2**30)


def disk_bps() -> tuple[float, float]:
    """(read, write) bytes/s assumed for model loads and checkpoint writes."""
    disk = read("gpus.yaml")["disk"]
    return float(disk["read_bps"]), float(disk["write_bps"])


def compile_seconds(device_type: str) -> float:
    """torch.compile's one-off cost on a `device_type` (cuda | cpu) with a cold cache."""
    table = read("gpus.yaml")["compile_s"]
    return float(table.get(device_type, table["cuda"]))


def compile_speedup(device_type: str) -> float:
    """An eager step's time over a compiled one's on a `device_type` (cuda | cpu), as measured."""
    table = read("gpus.yaml")["compile_speedup"]
    return float(table.get(device_type, table["cuda"]))


def scaling_efficiency(strategy: str) -> float:
    return float(read("gpus.yaml")["scaling"][strategy])


def prices(gpu_id: str) -> list[Price]:
    return [Price(**{**row, "date": str(row["date"])}) for row in read("prices.yaml")["prices"] if row["gpu"] == gpu_id]


@dataclass(frozen=True)
class Ceilings:
    """What a catalog GPU's kernels reach at best, as published (gpus.yaml): 0 where nothing is published."""

    mamf_flops: float  # the Maximum Achievable Matmul FLOP/s (bf16, dense)
    mamf_source: str
    attention_fraction: float  # fused attention kernels' share of the dense peak, per architecture
    attention_source: str


def ceilings(gpu_id: str) -> Ceilings:
    """The published ceilings of a catalog GPU; an id that is not a catalog row (a CPU class) has none."""
    rows = read("gpus.yaml")["gpus"]
    row = rows.get(gpu_id, {})
    arch = row.get("class", "").rsplit("-", 1)[-1]
    kernel = (read("gpus.yaml").get("attention-kernels") or {}).get(arch, {}) if row else {}
    return Ceilings(
        mamf_flops=float(row.get("mamf_tflops", 0.0)) * 1e12,
        mamf_source=row.get("mamf_source", ""),
        attention_fraction=float(kernel.get("fraction", 0.0)),
        attention_source=kernel.get("source", ""),
    )


@dataclass(frozen=True)
class StepConstants:
    """The step-time constants (plan/steptime.py) of a device, with where each comes from."""

    matmul: float
    attention: float
    bandwidth: float
    launch_s: float
    measured: tuple[str, ...]  # constants fitted on this device's own measured rows
    carried_from: tuple[str, ...]  # devices the other constants were fitted on (empty: assumed)
    rows: tuple[str, ...]  # the results files and rows this device's constants come from
    bandwidth_gbs: float = 0.0  # a local CPU class's measured bandwidth (0: the catalog row's)
    bandwidth_source: str = ""
    # Carried constants scaled from the measured devices to this GPU by its published ceilings (`ceiling_scale`).
    scaled: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        names = ("matmul", "attention", "bandwidth", "launch_s")
        carried = [n for n in names if n not in self.measured]
        where = ", ".join(self.carried_from) if self.carried_from else "assumed, no measured device of this kind"
        parts = []
        if self.measured:
            parts.append(f"measured here: {', '.join(self.measured)}")
        if carried:
            parts.append(f"carried over ({where}): {', '.join(carried)}")
        if self.scaled:
            parts.append(f"scaled to this GPU's published ceilings: {', '.join(self.scaled)}")
        return "; ".join(parts)


def step_constants(device: str, device_type: str) -> StepConstants:
    """The fitted constants (catalog/fitted.yaml, written by `tunelab bench fit --write`) of `device` (a catalog
    GPU id or a local CPU class); a device without measured rows gets those pooled over its CPU class's measured
    vendors (`class_chain`), else over its kind's measured devices (cuda or cpu), all reported as carried over, and
    scaled to its own ceilings where published (`ceiling_scale`)."""
    data = read("fitted.yaml") or {}
    kind = "cpu" if device_type == "cpu" else "cuda"
    chain = class_chain(device)
    row = (data.get("devices") or {}).get(chain[0])
    if row is not None:
        pool = data["kinds"][kind]["devices"]
        return StepConstants(
            **{k: float(v) for k, v in row["constants"].items()},
            measured=tuple(row["measured"]),
            carried_from=tuple(d for d in pool if d != device),
            rows=tuple(row["rows"]),
            bandwidth_gbs=float(row.get("bandwidth_gbs", 0.0)),
            bandwidth_source=row.get("bandwidth_source", ""),
        )
    # A CPU class without rows of its own (another vendor's, or one whose vendor is unknown): the class pooled over
    # the vendors measured (fitted.yaml's `classes`), else the kind's.
    shared = next((c for c in ((data.get("classes") or {}).get(k) for k in chain) if c is not None), None)
    pool = shared or data["kinds"][kind]
    local = next((r for r in (data.get("devices") or {}).values() if r["kind"] == kind and "bandwidth_gbs" in r), {})
    constants = {k: float(v) for k, v in pool["constants"].items()}
    scaled = ceiling_scale(device, tuple(pool["devices"]), data.get("devices") or {}) if kind == "cuda" else {}
    return StepConstants(
        **{**constants, **scaled},
        measured=(),
        carried_from=tuple(pool["devices"]),
        rows=(),
        bandwidth_gbs=float(local.get("bandwidth_gbs", 0.0)),
        bandwidth_source=local.get("bandwidth_source", ""),
        scaled=tuple(scaled),
    )


def ceiling_scale(device: str, measured: tuple[str, ...], rows: dict) -> dict[str, float]:
    """An unmeasured GPU's matmul and attention constants from the measured GPUs' (`rows`, fitted.yaml): each
    measured GPU's achieved rate over its own ceiling (its MAMF; its architecture's attention share), averaged,
    times this GPU's ceiling over its peak. A constant is scaled only where this GPU and every measured GPU
    have the ceiling published; otherwise the pooled constant stands."""
    if device not in gpu_ids():
        return {}
    own = ceilings(device)
    peak = gpu(device).peak_flops
    theirs = [(d, ceilings(d), gpu(d).peak_flops) for d in measured if d in gpu_ids() and d in rows]
    if not theirs:
        return {}
    out: dict[str, float] = {}
    if own.mamf_flops and all(c.mamf_flops for _, c, _ in theirs):
        share = [float(rows[d]["constants"]["matmul"]) * p / c.mamf_flops for d, c, p in theirs]
        out["matmul"] = sum(share) / len(share) * own.mamf_flops / peak
    if own.attention_fraction and all(c.attention_fraction for _, c, _ in theirs):
        share = [float(rows[d]["constants"]["attention"]) / c.attention_fraction for d, c, _ in theirs]
        out["attention"] = sum(share) / len(share) * own.attention_fraction
    return out


def product_call_s(device: str, device_type: str) -> tuple[float, str]:
    """Seconds one small product costs beyond its arithmetic on `device` (a local CPU class: catalog/calls.yaml,
    measured by probe.product_call_s), and where the figure comes from: a class without a row gets the CPU kind's.
    0 on a GPU, whose experts run as one grouped kernel (plan/steptime.expert_product_calls is not counted there)."""
    if device_type != "cpu":
        return 0.0, ""
    data = read("calls.yaml")
    row = next((data["devices"][k] for k in class_chain(device) if k in data["devices"]), None)
    if row is not None:
        return float(row["call_s"]), row["source"]
    kind = data["kinds"]["cpu"]
    return float(kind["call_s"]), f"{kind['source']} (no row for {device})"


def stack_pair_bytes(stack: str, kind: str) -> tuple[float, tuple[str, ...]]:
    """A peer stack's fitted bytes per masked head-pair on a kind of device (cuda | cpu: catalog/fitted.yaml
    `stacks`: what its masked attention kernel moves beyond plan's parts) and the rows it was fitted on; 0 for a
    stack without measured rows (tunelab's own)."""
    row = (read("fitted.yaml") or {}).get("stacks", {}).get(stack)
    if row is None:
        return 0.0, ()
    return float(row["masked_pair_bytes"][kind]), tuple(row["rows"])


@dataclass(frozen=True)
class GrpoConstants:
    """A device's GRPO fit (catalog/grpo.yaml): seconds per op of a decode step's forward, and the factors on
    plan's update and scoring passes, with the measured runs they come from; the fraction of the peak a decode
    step's few-row products reach (1 where the fitted runs had one batch size, which cannot tell it from the
    per-op cost)."""

    decode_op_s: float
    update_scale: float
    scoring_scale: float
    rows: tuple[str, ...]
    decode_flop_efficiency: float = 1.0


def grpo_constants(device: str) -> GrpoConstants | None:
    """The GRPO fit of `device` (a catalog GPU id or a local CPU class), None where no GRPO run was fitted."""
    devices = (read("grpo.yaml") or {}).get("devices") or {}
    row = next((devices[k] for k in class_chain(device) if k in devices), None)
    if row is None:
        return None
    c = row["constants"]
    return GrpoConstants(
        float(c["decode_op_s"]),
        float(c["update_scale"]),
        float(c["scoring_scale"]),
        tuple(row["rows"]),
        float(c.get("decode_flop_efficiency", 1.0)),
    )
