"""Peak memory as docs/metrics.md defines it.

CUDA: `torch.cuda.max_memory_allocated` / `max_memory_reserved`. CPU: the process's peak RSS (VmHWM).
Linux lets a process reset its own VmHWM by writing "5" to /proc/self/clear_refs, which gives a peak
over a window (after model load, say) rather than over the process's life.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")


def _status_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def rss_bytes() -> int:
    return _status_kib("VmRSS") * 1024


def peak_rss_bytes() -> int:
    return _status_kib("VmHWM") * 1024


def reset_peak_rss() -> bool:
    """Start a new peak window at the current RSS; False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@dataclass
class MemoryReading:
    peak_bytes: int  # CUDA: max allocated; CPU: peak RSS minus the baseline RSS
    peak_reserved_bytes: int | None  # CUDA only
    peak_absolute_bytes: int  # CPU: peak RSS of the process; CUDA: max reserved


class MemoryWatch:
    """Peak memory since `start()`: on CPU, relative to the RSS at `start()` (before the model loads)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.baseline = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = 0
        else:
            reset_peak_rss()
            self.baseline = rss_bytes()

    def read(self) -> MemoryReading:
        if self.device.type == "cuda":
            reserved = torch.cuda.max_memory_reserved(self.device)
            return MemoryReading(torch.cuda.max_memory_allocated(self.device), reserved, reserved)
        peak = peak_rss_bytes()
        return MemoryReading(max(peak - self.baseline, 0), None, peak)


def saved_forward_bytes(loss_module: torch.nn.Module, batch, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes autograd saves for backward in one forward of `loss_module` (train/loss.CausalLMLoss) over `batch` (a
    data.packing micro-batch) under CPU autocast to `dtype`: the storages still alive when the forward ends, each
    counted once, the parameters' own left out. What plan's activation term predicts, measured without a backward.

    Weak references: a tensor saved by a graph that the forward then drops (peft's DoRA builds its adapter weight
    with autograd and uses only a detached copy) is freed before backward and is not memory the step holds; and
    its address can be reused by a later saved tensor, so counting by address at save time depended on the
    allocator (17.12 MiB on one CPU class, 17.59 on another, for the same forward)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    params = {p.untyped_storage().data_ptr() for p in loss_module.parameters()}
    saved: list[tuple[StorageWeakRef, int, int]] = []

    def keep(t):
        storage = t.untyped_storage()
        saved.append((StorageWeakRef(storage), storage.data_ptr(), storage.nbytes()))
        return t

    def array(x):
        return None if x is None else torch.from_numpy(x)  # unpacked rows have no position ids

    inputs = (batch.input_ids, batch.position_ids, batch.loss_index, batch.loss_targets)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), torch.autocast("cpu", dtype):
        loss = loss_module(*(array(x) for x in inputs), batch.layout)  # held: its graph keeps what backward reads
    alive = {ptr: nbytes for ref, ptr, nbytes in saved if not ref.expired() and ptr not in params}
    del loss
    return sum(alive.values())
