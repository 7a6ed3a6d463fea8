"""Whether the routing's skew prices tunelab's CPU experts: one stacked projection (64 experts, hidden 256 into
512, bf16) over the same 8,192 sorted rows (1,024 tokens, top-8) split by routers of growing skew, through
model/moe.Segments.mm (one product per expert reached, one after another), the fastest of 7 after 3 warm-ups; and
one product over all the rows. Run it on tunelab's allocator (jemalloc, as its CLI runs; on glibc the output
buffers' page faults add a skew-dependent noise):

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1,oversize_threshold:0 \\
        PYTHONPATH=src python benchmarks/scripts/moe_cpu_skew.py
"""

from __future__ import annotations

import json
import time

import torch

from tunelab.model.moe import Segments

E, K, T = 64, 8, 1024


def fastest(run, repeats: int = 7) -> float:
    for _ in range(3):
        run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    torch.set_num_threads(2)
    rows = T * K
    w = torch.randn(E, 256, 512).to(torch.bfloat16)
    x = torch.randn(rows, 256).to(torch.bfloat16)
    out = []
    for skew in (0.0, 1.0, 2.0, 4.0, 0.0, 1.0, 2.0, 4.0):
        g = torch.Generator().manual_seed(len(out))
        p = torch.rand(E, generator=g) ** skew
        counts = torch.distributions.Multinomial(rows, p / p.sum()).sample().long()
        seg = Segments(torch.repeat_interleave(torch.arange(E), counts), counts, E)
        tiled = x.new_zeros(seg.rows, x.shape[1]).index_copy_(0, seg.pos, x)  # the rows in tiles, as dispatched
        s = fastest(lambda seg=seg, tiled=tiled: seg.mm(tiled, w))
        hit = int((counts > 0).sum())
        out.append({"skew": skew, "max_over_mean": counts.max().item() * E / rows, "hit": hit, "s": s})
    one = fastest(lambda: torch.mm(x, w[0]))
    print(json.dumps({"rows": rows, "segments": out, "one_product_s": one}))


if __name__ == "__main__":
    main()
