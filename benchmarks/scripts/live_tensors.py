"""After the second optimizer step, jemalloc's allocated bytes and every live tensor that is not a parameter (by storage,
largest first): what a full fine-tune keeps between steps. Runs `tunelab train` in this process (see run.sh)."""

import gc
import sys

import torch

sys.path.insert(0, "benchmarks/scripts")
import step_memory as sm

from tunelab.cli import main
from tunelab.train import loop

real = loop._optimizer_step
n = {"k": 0}


def step(ctx, *a, **k):
    out = real(ctx, *a, **k)
    n["k"] += 1
    if n["k"] == 2:
        params = {p.untyped_storage().data_ptr() for p in ctx.loss_fn.parameters()}
        seen, rows = set(), []
        for o in gc.get_objects():
            try:
                if isinstance(o, torch.Tensor) and not o.is_meta:
                    s = o.untyped_storage()
                    ptr = s.data_ptr()
                    if ptr in seen or ptr in params:
                        continue
                    seen.add(ptr)
                    rows.append((s.nbytes(), tuple(o.shape), str(o.dtype)))
            except Exception:
                pass
        rows.sort(reverse=True)
        print(
            "ALLOCATED",
            sm.stats()["allocated"] / 2**30,
            "tensors(non-param)",
            sum(r[0] for r in rows) / 2**30,
            file=sys.stderr,
        )
        for r in rows[:8]:
            print("  ", r, file=sys.stderr)
    return out


loop._optimizer_step = step
sys.exit(main(["train", *sys.argv[1:]]))
