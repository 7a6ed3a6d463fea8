"""Device peak and utilization (docs/metrics.md): what bench divides by, and how it got it.

- CPU: no datasheet figure means anything for a shared, frequency-scaling CPU, so the peak is measured at
  run time by a large matmul probe, in bf16 and in fp32; the dtype of the run's compute precision applies.
- GPU: the catalog's dense 16-bit peak (plan's gpus.yaml) of the row matched to the device name; a bf16/fp16
  probe runs too, to show the achievable fraction of that datasheet figure (docs/formulas.md: about 80%).
- FLOPs per token come from plan (`FlopsPerToken`): mfu counts the model FLOPs, hfu adds recomputation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..plan import catalog
from ..plan.flops import FlopsPerToken
from ..probe import copy_bandwidth, mamf, matmul_peak, product_call_s


@dataclass(frozen=True)
class Peak:
    flops: float  # device_peak_flops: what mfu/hfu divide by
    dtype: str  # the dtype whose figure applies to the run (its compute precision)
    source: str  # how it was obtained, printed and stored with every record
    probes: dict[str, float]  # measured matmul FLOP/s per dtype at run time
    bandwidth: float = 0.0  # a CPU's copy probe at run time, bytes/s (probe.copy_bandwidth); 0 on a GPU
    # A CPU's product-call probe at run time in the run's dtype, seconds (probe.product_call_s); 0 on a GPU
    call_s: float = 0.0
    # A GPU's ceilings at run time: its copy probe (bytes/s; plan keeps the catalog's bandwidth for a GPU) and the
    # MAMF sweep (probe.mamf): FLOP/s and the (m, n, k) that reached it; 0 on a CPU.
    gpu_copy_bps: float = 0.0
    mamf: float = 0.0
    mamf_shape: tuple[int, int, int] = (0, 0, 0)

    def as_dict(self) -> dict:
        return asdict(self)


def probe_dtypes(device: torch.device, compute: str) -> tuple[str, ...]:
    """CPU: bf16 and fp32 (both printed; the run's applies). GPU: the run's 16-bit dtype only."""
    if device.type == "cpu":
        return ("bf16", "fp32")
    return (compute if compute != "fp32" else "bf16",)


def device_peak(
    device: torch.device, name: str, memory_bytes: int, compute: str, gpu_id: str | None = None, fresh: bool = False
) -> Peak:
    """device_peak_flops for a run whose compute precision is `compute` (bf16 | fp16 | fp32).

    `gpu_id` names the catalog row when the device name does not match one (an unlisted board); `fresh` probes
    again instead of reading this process's earlier probe.
    """
    from ..device import DTYPES

    measured = {d: matmul_peak(DTYPES[d], device, fresh) for d in probe_dtypes(device, compute)}
    probes = {d: flops for d, (flops, _) in measured.items()}
    if device.type == "cpu":
        n = measured[compute][1]
        source = f"measured now: {n}^3 {compute} matmul probe on {name}"
        call = product_call_s(DTYPES[compute], device, fresh)
        return Peak(probes[compute], compute, source, probes, copy_bandwidth(device, fresh), call)
    row = catalog.gpu(gpu_id) if gpu_id else catalog.match_gpu(name, memory_bytes)
    dtype, (probed, n) = next(iter(measured.items()))
    # Every GPU bench runs on adds its ceilings: the MAMF sweep and the copy bandwidth, stored with the record.
    ceiling, shape = mamf(DTYPES[dtype], device, fresh)
    ceilings = {"gpu_copy_bps": copy_bandwidth(device, fresh), "mamf": ceiling, "mamf_shape": shape}
    mamf_text = f"; MAMF {ceiling / 1e12:.1f} TFLOP/s at {'x'.join(map(str, shape))}"
    if row is None:
        return Peak(
            probed,
            dtype,
            f"measured now: {n}^3 {dtype} matmul probe (no catalog row matches {name!r}; "
            f"pass --catalog-gpu ID for its datasheet figure){mamf_text}",
            probes,
            **ceilings,
        )
    return Peak(
        row.peak_flops,
        dtype,
        f"catalog {row.id}: {row.source}; the probe reached {probed / row.peak_flops:.0%} of it{mamf_text}",
        probes,
        **ceilings,
    )


def mfu(tokens_nonpad_per_s: float, flops: FlopsPerToken, peak_flops: float) -> float:
    """docs/metrics.md: tokens_nonpad_per_s x model_flops_per_token / device_peak_flops (no recomputation)."""
    return tokens_nonpad_per_s * flops.model / peak_flops


def useful_mfu(tokens_nonpad_per_s: float, flops: FlopsPerToken, peak_flops: float) -> float:
    """docs/metrics.md `mfu_useful`: mfu with attention counted over the document-causal work only."""
    return tokens_nonpad_per_s * flops.useful / peak_flops


def hfu(tokens_nonpad_per_s: float, flops: FlopsPerToken, peak_flops: float) -> float:
    """Like mfu, counting gradient checkpointing's recomputed forward (docs/metrics.md)."""
    return tokens_nonpad_per_s * flops.hardware / peak_flops


def achieved_efficiency(tokens_padded_per_s: float, hardware_flops_per_token: float, peak_flops: float) -> float:
    """A calibration record's flat efficiency: every fed position (padding included) costs hardware FLOPs, so
    this is the fraction of the peak that makes a rate of peak x efficiency / FLOPs per token the measured one."""
    return tokens_padded_per_s * hardware_flops_per_token / peak_flops
