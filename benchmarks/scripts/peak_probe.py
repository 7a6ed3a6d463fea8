"""Sample the RSS and jemalloc's counters every ~2 ms on a thread; keep, per optimizer step, the sample at the step's RSS
high and the phase it fell in (forward, backward, step). PURGE=1 returns freed pages in an optimizer-step pre-hook
(jemalloc's arena.<all>.purge), as finetune.py now does. Runs `tunelab train` in this process."""

import ctypes
import json
import os
import sys
import threading
import time

sys.path.insert(0, "benchmarks/scripts")  # run from the repository root
import step_memory as sm
import torch.optim.optimizer as oo

from tunelab.cli import main
from tunelab.train import loop

GIB = 2**30
PAGE = os.sysconf("SC_PAGE_SIZE")
phase = {"name": "load", "step": 0}
best = {"rss": 0}
per_step = {}


def rd(name):
    v, s = ctypes.c_size_t(), ctypes.c_size_t(8)
    sm._ctl(name.encode(), ctypes.byref(v), ctypes.byref(s), None, 0)
    return v.value


def sample():
    fd = os.open("/proc/self/statm", os.O_RDONLY)
    while True:
        os.lseek(fd, 0, 0)
        rss = int(os.read(fd, 200).split()[1]) * PAGE
        key = phase["step"]
        cur = per_step.get(key)
        if cur is None or rss > cur["rss"]:
            e = ctypes.c_uint64(1)
            sm._ctl(b"epoch", None, None, ctypes.byref(e), 8)
            row = {
                "rss": rss,
                "phase": phase["name"],
                "allocated": rd("stats.allocated"),
                "active": rd("stats.active"),
                "resident": rd("stats.resident"),
                "metadata": rd("stats.metadata"),
                "pdirty": rd("stats.arenas.4096.pdirty") * PAGE,
                "pmuzzy": rd("stats.arenas.4096.pmuzzy") * PAGE,
            }
            per_step[key] = row
        time.sleep(0.002)


real_fwd = loop.forward


def fwd(*a, **k):
    phase["name"] = "forward"
    out = real_fwd(*a, **k)
    phase["name"] = "backward"
    return out


real_step = loop._optimizer_step


def ostep(*a, **k):
    phase["step"] += 1
    out = real_step(*a, **k)
    r = per_step.get(phase["step"])
    if r:
        print(
            json.dumps(
                {"step": phase["step"], **{k: (round(v / GIB, 3) if isinstance(v, int) else v) for k, v in r.items()}}
            ),
            flush=True,
        )
    return out


def pre(*a):
    if os.environ.get("PURGE") == "1":
        sm._ctl(b"arena.4096.purge", None, None, None, 0)
    phase["name"] = "step"


oo.register_optimizer_step_pre_hook(pre)
oo.register_optimizer_step_post_hook(lambda *a: phase.__setitem__("name", "after-step"))
loop.forward, loop._optimizer_step = fwd, ostep
threading.Thread(target=sample, daemon=True).start()
sys.exit(main(["train", *sys.argv[1:]]))
