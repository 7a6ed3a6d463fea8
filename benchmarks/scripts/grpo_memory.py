"""Where a GRPO run's memory goes on CPU, per generation batch: the live bytes jemalloc counts on the training
thread (as step_memory.py reads them) when the batch starts, at their peak while sampling, after sampling (the
rollouts kept for the update), at their peak during the update, and the process's RSS and jemalloc's resident
bytes. Runs `tunelab train` on a GRPO config in this process; one JSON line per generation batch on stdout.

  LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1,oversize_threshold:0 \
    PYTHONPATH=src python benchmarks/scripts/grpo_memory.py --config configs/quickstart-grpo.yaml max_steps=4 ...
"""

from __future__ import annotations

import json
import sys

from step_memory import GIB, read, reset_peak, stats

from tunelab import memwatch
from tunelab.cli import main
from tunelab.recipes import grpo

real_generate, real_iterate = grpo.GrpoSource.generate, grpo.GrpoSource.iterate
row: dict = {}


def generate(source, generation):
    start = stats()["allocated"]
    reset_peak()
    out = real_generate(source, generation)
    row.clear()
    row.update(
        batch=generation + 1,
        live_start_gib=start / GIB,
        live_peak_sampling_gib=(start + read("thread.peak.read")) / GIB,
        live_after_sampling_gib=stats()["allocated"] / GIB,
    )
    return out


def iterate(source, start, stop):
    """The source's steps; the shared loop's update of each runs while it is yielded."""
    for step, micro in real_iterate(source, start, stop):
        begin = stats()["allocated"]
        reset_peak()
        try:
            yield step, micro
        finally:
            if (step + 1) % source.unit == 0:  # a generation batch's last update
                after = stats()
                row.update(
                    live_peak_update_gib=(begin + read("thread.peak.read")) / GIB,
                    live_after_update_gib=after["allocated"] / GIB,
                    resident_gib=after["resident"] / GIB,
                    rss_gib=memwatch.rss_bytes() / GIB,
                    rss_peak_gib=memwatch.peak_rss_bytes() / GIB,
                )
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)


if __name__ == "__main__":
    grpo.GrpoSource.generate, grpo.GrpoSource.iterate = generate, iterate
    sys.exit(main(["train", *sys.argv[1:]]))
