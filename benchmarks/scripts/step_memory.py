"""Where a training step's memory goes on CPU, per optimizer step: the live bytes jemalloc counts (its
`thread.peak`: allocated minus freed by the training thread, its peak since the step began; the autograd engine runs
CPU backward on that thread), the live bytes when the forward ends (every activation alive: plan's peak moment),
and the process's RSS and jemalloc's resident bytes (freed pages kept: tunelab's MALLOC_CONF turns decay off).
Runs `tunelab train` in this process with the settings given; one JSON line per step on stdout. With
`STEP_MEMORY_SMAPS=1`, each line also carries `smaps`: the RSS by mapping (`/proc/self/smaps`), so memory outside
jemalloc's heap can be named; one more line, `"step": 0`, gives it before the model loads.

  LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1,oversize_threshold:0 \
    PYTHONPATH=src python benchmarks/scripts/step_memory.py --config configs/quickstart.yaml method=full ...
"""

from __future__ import annotations

import ctypes
import json
import os
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


def smaps() -> dict[str, float]:
    """The RSS by mapping, in GiB: file-backed pages per file (shared libraries together; a file's pages the process
    wrote are anonymous: copy-on-write), anonymous mappings, [heap] and [stack]; the lazily freed pages (MADV_FREE)
    still in it; and jemalloc's resident bytes beside them."""
    mappings: list[list] = []  # [name, Rss KiB, Anonymous KiB] per mapping
    lazy = 0
    for line in open("/proc/self/smaps"):
        head = line.split()
        if not head[0].endswith(":"):  # a mapping's first line: address range, perms, offset, dev, inode[, path]
            mappings.append([head[5] if len(head) > 5 else "", 0, 0])
        elif head[0] in ("Rss:", "Anonymous:"):
            mappings[-1][1 if head[0] == "Rss:" else 2] = int(head[1])
        elif head[0] == "LazyFree:":
            lazy += int(head[1])
    parts: dict[str, float] = {}
    for name, rss, anon in mappings:
        kind = ("file:so" if ".so" in name else "file:" + name.rsplit("/", 1)[-1]) if name.startswith("/") else name
        kind = kind or "anon"
        parts[kind + " rss"] = parts.get(kind + " rss", 0) + rss * 1024 / GIB
        if anon and kind != "anon":
            parts[kind + " written"] = parts.get(kind + " written", 0) + anon * 1024 / GIB
    parts["lazy free (in the RSS until the system needs it)"] = lazy * 1024 / GIB
    parts["jemalloc resident"] = stats()["resident"] / GIB
    return {k: round(v, 3) for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v >= 0.002}


SMAPS = os.environ.get("STEP_MEMORY_SMAPS") == "1"
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
    if SMAPS:
        row["smaps"] = smaps()
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    return out


if __name__ == "__main__":
    loop._optimizer_step, loop.forward = optimizer_step, forward
    if SMAPS:
        print(json.dumps({"step": 0, **rss_parts(), "smaps": smaps()}), flush=True)
    sys.exit(main(["train", *sys.argv[1:]]))
