"""Run the process on jemalloc when the system has it (Debian/Ubuntu package libjemalloc2).

Why: with glibc malloc a training run's RSS grew with every step, with no plateau, because each batch brings
new activation sizes and the freed heap blocks fit nothing that comes later; forcing big blocks back to the OS
with mmap held memory flat but slowed every step with page faults. jemalloc's size classes reuse freed memory
across sizes, which kept RSS flat and steps faster
(benchmarks/design-decisions_cpu_2026-11-22.md#jemalloc-instead-of-glibc-malloc).
Freed pages are kept (decay off) so they are not faulted in again on every step.

The allocator is chosen when the process starts, so the CLI re-executes itself once with LD_PRELOAD set.
TUNELAB_ALLOCATOR=system opts out; an LD_PRELOAD already naming jemalloc is left alone.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so.2",
)
# Keep freed pages (no decay back to the OS): re-faulting them each step is what made mmap'd blocks slow.
# oversize_threshold:0 turns off jemalloc's dedicated arena for requests of 8 MiB and more (activations of a
# few thousand tokens: 4096 x 1536 bf16 is 12 MiB), whose freed extents the other arenas' requests cannot
# reuse; without it runs were faster and smaller
# (benchmarks/design-decisions_cpu_2026-11-22.md#jemalloc-oversize-threshold-0).
MALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1,oversize_threshold:0"
# Except where resident memory grew without bound with decay off while the live bytes stayed flat, and returning
# freed pages after a second kept it flat: a full fine-tune (0.2 GiB a step, 64 steps of the 135M model: 2.4 ->
# 14.5 GiB, one arena or eight; no measured cost to its step, where LoRA runs paid 4% for it) and GRPO, whose
# rollouts change shape every batch (0.3-0.7 GiB a batch at 128 completions: 21 GiB after 28)
# (benchmarks/design-decisions_cpu_2026-11-28.md#full-fine-tuning-returns-freed-pages, #grpo-returns-freed-pages;
# GRPO now frees them lazily only).
DECAY_MS = 1000
# A decayed page is first freed lazily (MADV_FREE: it stays in the RSS until the system needs it, and coming back
# to it costs no page fault), then for good this much later. Lazily for ever left up to 1 GiB of freed pages in a
# full fine-tune's RSS; for good at once made its step 16% slower in page faults, 5 s later 9.5%
# (benchmarks/design-decisions_cpu_2026-11-28.md#freed-pages-are-returned-for-good). GRPO frees lazily only: 5 s
# later made its quickstart 16-29% slower (#grpo-frees-pages-lazily-only).
RETURN_MS = 5000


def find_jemalloc() -> str | None:
    return next((p for p in CANDIDATES if Path(p).is_file()), None)


def reexec_with_jemalloc() -> None:
    """Replace this process with the same command under jemalloc, if available and not already in use."""
    if os.environ.get("TUNELAB_ALLOCATOR", "jemalloc") != "jemalloc" or "jemalloc" in os.environ.get("LD_PRELOAD", ""):
        return
    lib = find_jemalloc()
    if lib is None:
        return
    preload = " ".join(filter(None, [lib, os.environ.get("LD_PRELOAD")]))
    env = {**os.environ, "LD_PRELOAD": preload, "MALLOC_CONF": os.environ.get("MALLOC_CONF", MALLOC_CONF)}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def _mallctl():
    """jemalloc's mallctl, or None when the process does not run on jemalloc (glibc malloc has none)."""
    try:
        ctl = ctypes.CDLL(None).mallctl
    except (OSError, AttributeError):
        return None
    ctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p, ctypes.c_size_t]
    return ctl


def return_freed_pages() -> bool:
    """Return every page the program has freed and jemalloc still holds, in every arena, to the system now
    (`arena.<all>.purge`). Called before an optimizer step that allocates scratch (Optimizer.step_scratch): that
    step is the full fine-tune's peak, and the pages backward freed under RETURN_MS before it were still in the RSS
    beside it (8-bit AdamW: 0.30 GiB; its peak is 15% lower without them, at no measurable cost;
    benchmarks/design-decisions_cpu_2026-11-28.md#freed-pages-are-returned-before-a-step-with-scratch). False when
    the process does not run on jemalloc."""
    ctl = _mallctl()
    return ctl is not None and ctl(b"arena.4096.purge", None, None, None, 0) == 0  # 4096: MALLCTL_ARENAS_ALL


def decay_freed_pages(ms: int, returned_ms: int = RETURN_MS) -> bool:
    """Have jemalloc free pages lazily `ms` milliseconds after the program freed them, and return them for good
    `returned_ms` later (RETURN_MS), from now on, in every arena and in those made later. False (nothing changed)
    when the process does not run on jemalloc."""
    ctl = _mallctl()
    if ctl is None:
        return False
    count, size = ctypes.c_uint(), ctypes.c_size_t(ctypes.sizeof(ctypes.c_uint))
    if ctl(b"arenas.narenas", ctypes.byref(count), ctypes.byref(size), None, 0):
        return False
    results = []
    for kind, after in (("dirty", ms), ("muzzy", returned_ms)):
        value = ctypes.c_ssize_t(after)
        names = [f"arena.{i}.{kind}_decay_ms" for i in range(count.value)] + [f"arenas.{kind}_decay_ms"]
        # An arena not yet in use answers with an error: there is nothing in it to decay.
        results += [ctl(name.encode(), None, None, ctypes.byref(value), ctypes.sizeof(value)) for name in names]
    return results[-1] == 0
