"""Where a training step's memory goes on CPU, per optimizer step: the live bytes jemalloc counts (its
`thread.peak`: allocated minus freed by the training thread, its peak since the step began; the autograd engine runs
CPU backward on that thread), the live bytes when the forward ends (every activation alive: plan's peak moment),
and the process's RSS and jemalloc's resident bytes (freed pages kept: tunelab's MALLOC_CONF turns decay off).
Runs `tunelab train` in this process with the settings given; one JSON line per step on stdout.

  LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1,oversize_threshold:0 \
    PYTHONPATH=src python benchmarks/scripts/step_memory.py --config configs/quickstart.yaml method=full ...
"""

from __future__ import annotations

import ctypes
import json
import sys

from tunelab import memwatch
from tunelab.cli import main
from tunelab.train import loop

_lib = ctypes.CDLL(None)
_ctl = _lib.mallctl
_ctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p, ctypes.c_size_t]


def read(name: str) -> int:
    value, size = ctypes.c_uint64(), ctypes.c_size_t(8)
    if _ctl(name.encode(), ctypes.byref(value), ctypes.byref(size), None, 0):
        raise RuntimeError(f"mallctl {name} failed: run under jemalloc (LD_PRELOAD)")
    return value.value


def stats() -> dict[str, int]:
    epoch = ctypes.c_uint64(1)
    _ctl(b"epoch", None, None, ctypes.byref(epoch), 8)
    return {"allocated": read("stats.allocated"), "resident": read("stats.resident")}


def reset_peak() -> None:
    """Start this thread's `thread.peak` over (jemalloc 5.3)."""
    _ctl(b"thread.peak.reset", None, None, None, 0)


GIB = 2**30


def rss_parts() -> dict[str, float]:
    """The RSS by kind (/proc/self/status): anonymous pages (the heap, jemalloc's and others'), file-backed pages
    (mapped files: libraries, a memory-mapped model), shared memory."""
    parts = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile", "RssShmem"):
            parts[f"{key[3:].lower()}_gib"] = int(value.split()[0]) * 1024 / GIB
    return parts


state = {"step": 0, "forward_end": 0}
real_step, real_forward = loop._optimizer_step, loop.forward


def forward(*args, **kwargs):
    out = real_forward(*args, **kwargs)
    state["forward_end"] = stats()["allocated"]
    state["forward_peak"] = read("thread.peak.read")
    return out


def optimizer_step(*args, **kwargs):
    state["step"] += 1
    start = stats()["allocated"]
    reset_peak()
    out = real_step(*args, **kwargs)
    peak = read("thread.peak.read")  # net bytes this thread allocated since the reset, at its highest
    after = stats()
    row = {
        "step": state["step"],
        "live_start_gib": start / GIB,
        "live_forward_end_gib": state["forward_end"] / GIB,
        "live_peak_gib": (start + peak) / GIB,
        "live_peak_in_forward_gib": (start + state["forward_peak"]) / GIB,
        "live_after_gib": after["allocated"] / GIB,
        "resident_gib": after["resident"] / GIB,
        "rss_gib": memwatch.rss_bytes() / GIB,
        "rss_peak_gib": memwatch.peak_rss_bytes() / GIB,
        **rss_parts(),
    }
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    return out


if __name__ == "__main__":
    loop._optimizer_step, loop.forward = optimizer_step, forward
    sys.exit(main(["train", *sys.argv[1:]]))
