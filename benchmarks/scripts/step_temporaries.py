"""Peak RSS above the live tensors while one bf16 weight steps (train/optim.PerParameter), per optimizer and
bf16_update, chunked (runtime.STEP_CHUNK) and whole, in bytes per value of the weight (whole) or of the piece
(chunked). The weight and its bf16 gradient exist before the window; the states after the first step, which is
not measured. One JSON line per case on stdout.
  MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/scripts/step_temporaries.py  (big tensors mmapped: RSS is live)"""

from __future__ import annotations

import json
import sys

import torch

from tunelab import memwatch
from tunelab.config import OptimizerConfig
from tunelab.train import optim

VALUES = 1 << 26  # 64 Mi values: 128 MiB of bf16, 8 pieces of STEP_CHUNK


def case(name: str, update: str, chunked: bool) -> dict:
    w = torch.nn.Parameter(torch.randn(VALUES // 1024, 1024).to(torch.bfloat16))
    spec = OptimizerConfig(lr=1e-3, optimizer=name, bf16_update=update)
    row = optim.optimizers.get(name)
    build = optim.optimizers.load(row)
    chunk = optim.STEP_CHUNK if chunked and row.elementwise else 0
    opt = optim.PerParameter([w], lambda s: build([s], 1e-3, 0.0, torch.device("cpu")), spec, chunk=chunk)
    w.grad = torch.randn_like(w)
    opt.step()  # the states are created here
    w.grad = torch.randn_like(w)
    base = memwatch.rss_bytes()
    memwatch.reset_peak_rss()
    opt.step()
    extra = memwatch.peak_rss_bytes() - base
    piece = max(e - s for s, e in opt.spans[w])
    return {
        "optimizer": name,
        "bf16_update": update,
        "chunked": chunk > 0,
        "values": VALUES,
        "piece": piece,
        "peak_extra_bytes": extra,
        "bytes_per_piece_value": round(extra / piece, 2),
    }


if __name__ == "__main__":
    torch.manual_seed(0)
    names = sys.argv[1:] or ["adamw", "adamw_8bit", "adafactor"]
    for name in names:
        for update in ("stochastic", "kahan", "nearest"):
            for chunked in (False, True):
                print(json.dumps(case(name, update, chunked)), flush=True)
