"""Device and precision, decided once at a command's start and passed down."""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import TunelabError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Precision:
    """`name` is what the user sees; `compute` is the autocast/frozen-weight dtype."""

    name: str

    @property
    def compute(self) -> torch.dtype:
        return DTYPES[self.name]


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a product of `x` runs in: autocast's when it is on (custom autograd Functions run their
    backward outside autocast, so they must cast explicitly), else x's own."""
    return torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype


def to_device(array, device: torch.device) -> torch.Tensor:
    """A host numpy array as a tensor on `device`, its copy queued on the device's stream. On CUDA the array is
    first copied into page-locked memory, from torch's caching host allocator (no new allocation after the first
    steps): only from page-locked memory does the device's copy engine read it while the host goes on; from
    pageable memory the driver stages it through a buffer of its own on the host's time (the CUDA runtime's
    "API synchronization behavior"; PyTorch's guide to non_blocking and pin_memory)."""
    tensor = torch.from_numpy(array)
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise TunelabError(f"device {name!r}: no CUDA device is visible; use device: cpu or auto")
    try:
        return torch.device(name)
    except RuntimeError:
        raise TunelabError(f"device {name!r}: not a torch device name (auto, cpu, cuda, cuda:1)") from None


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# oneDNN's ISA levels in order (its ONEDNN_MAX_CPU_ISA values): a cap below AVX512_CORE_BF16 leaves bf16
# matmuls emulated even where the CPU has bf16 units, so the class follows the cap as well as the flags.
ONEDNN_ISAS = (
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16",
    "AVX10_1_512",
    "AVX512_CORE_FP16",
    "AVX10_1_512_AMX",
    "AVX512_CORE_AMX",
    "AVX10_1_512_AMX_FP16",
    "AVX512_CORE_AMX_FP16",
)


def _isa_cap() -> int:
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "ALL")).upper()
    return ONEDNN_ISAS.index(cap) if cap in ONEDNN_ISAS else len(ONEDNN_ISAS)


def cpu_class() -> str:
    """Which bf16 matmul units oneDNN may use here: `amx` (Xeon AMX, ~2 TFLOP/s on 2 cores), `avx512-bf16`
    (AVX512-BF16 dot products, about 2.5x fp32), or `fp32-only` (AVX2-class: bf16 is emulated at ~1 GFLOP/s,
    so training computes in fp32)."""
    flags, cap = cpu_flags(), _isa_cap()
    if "amx_bf16" in flags and cap >= ONEDNN_ISAS.index("AVX10_1_512_AMX"):
        return "amx"
    if "avx512_bf16" in flags and cap >= ONEDNN_ISAS.index("AVX512_CORE_BF16"):
        return "avx512-bf16"
    return "fp32-only"


# /proc/cpuinfo's vendor_id -> the vendor a CPU class names (plan/catalog.local_class): one instruction set runs on
# different cores per vendor, whose matmuls and memory reach different shares of the same probes.
VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}


def cpu_vendor() -> str:
    """`intel`, `amd`, or "" where /proc/cpuinfo names neither (another vendor, another OS)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return VENDORS.get(line.split(":", 1)[1].strip(), "")
    except OSError:
        pass
    return ""


def vendor_of_name(name: str) -> str:
    """The vendor a CPU's model name says (`Intel(R) Xeon(R) ...`, `AMD EPYC ...`): for results files that recorded
    the name but not the vendor."""
    words = set(re.findall(r"[a-z]+", name.lower()))
    return next((v for v in VENDORS.values() if v in words), "")


def cpu_has_fast_bf16() -> bool:
    """AMX or AVX512-BF16 run bf16 matmuls natively (oneDNN); without them bf16 on CPU is emulated and slow."""
    return cpu_class() != "fp32-only"


def pick_precision(name: str, device: torch.device) -> Precision:
    """`auto`: bf16 on Ampere+ GPUs and bf16-capable CPUs, fp16 (with loss scaling) on older GPUs, else fp32."""
    if name == "auto":
        if device.type == "cuda":
            return Precision("bf16" if torch.cuda.is_bf16_supported() else "fp16")
        return Precision("bf16" if cpu_has_fast_bf16() else "fp32")
    if name == "fp16" and device.type != "cuda":
        raise TunelabError("precision fp16 needs a CUDA GPU (CPUs have no fast fp16 matmul); use bf16 or auto")
    if name == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise TunelabError("precision bf16: this GPU has no bf16 support (pre-Ampere); use fp16 or auto")
    return Precision(name)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} ({torch.get_num_threads()} threads)"
    return platform.processor() or "cpu"


def device_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def out_of_memory(e: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator refusing a tensor (a RuntimeError that says so)."""
    return isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and "can't allocate memory" in str(e))


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work: timings read at a window's edge must include it (CPU ops are eager)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def library_versions() -> dict[str, str]:
    """Versions of the stack a run used: torch, transformers, peft, accelerate, and trl, bitsandbytes and
    liger-kernel where installed."""
    import importlib
    import importlib.util

    import accelerate
    import peft
    import transformers

    out = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "accelerate": accelerate.__version__,
    }
    # Read from the installed package's metadata: importing bitsandbytes or trl only for its version took ~1-2 s
    # in a process that had not imported them.
    from importlib.metadata import PackageNotFoundError, version

    for optional in ("trl", "bitsandbytes", "liger_kernel"):
        if importlib.util.find_spec(optional) is not None:
            try:
                out[optional] = version(optional)
            except PackageNotFoundError:
                out[optional] = getattr(importlib.import_module(optional), "__version__", "unknown")
    return out
