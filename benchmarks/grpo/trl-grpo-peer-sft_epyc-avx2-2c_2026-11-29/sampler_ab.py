"""The sampler side by side: torch's product (prepack off) against the reordered weights, one process, arms alternating."""
import sys, time, statistics, torch
from pathlib import Path
from tunelab.config import load_config
from tunelab.recipes import grpo
from tunelab.model import prepack
cfg = load_config(sys.argv[1], ["output_dir=/tmp/g/prof/run"] + sys.argv[2:])
run = grpo.setup(cfg, Path("/tmp/g/prof/run"))
real = prepack.applies
res = {"torch": [], "reordered": []}
for g in range(6):
    for arm in ("torch", "reordered"):
        prepack.applies = (lambda m, r: False) if arm == "torch" else real
        torch.manual_seed(g)
        b = grpo.generate_batch(run, g)
        res[arm].append((b["generation_s"], b["samples"].ids.shape if hasattr(b["samples"].ids, "shape") else len(b["samples"].ids)))
        print(arm, g, f"{b['generation_s']:.2f}", res[arm][-1][1], flush=True)
for arm, v in res.items():
    print(arm, "median of batches 1-5:", round(statistics.median(x[0] for x in v[1:]), 2), [round(x[0], 2) for x in v])
