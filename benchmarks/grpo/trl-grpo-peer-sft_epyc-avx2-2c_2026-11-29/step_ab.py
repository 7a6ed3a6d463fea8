"""GRPO steps side by side at configs/quickstart-grpo.yaml's shape: torch's product (prepack off) against the
reordered weights, one process, arms alternating batch by batch; sampling and the update timed apart."""
import sys, time, statistics, torch
from pathlib import Path
from tunelab.config import load_config
from tunelab.recipes import grpo
from tunelab.model import prepack
cfg = load_config("configs/quickstart-grpo.yaml", ["output_dir=/tmp/g/prof/run2"] + sys.argv[1:])
run = grpo.setup(cfg, Path("/tmp/g/prof/run2"))
real = prepack.applies
res = {"torch": [], "reordered": []}
for g in range(5):
    for arm in ("torch", "reordered"):
        prepack.applies = (lambda m, r: False) if arm == "torch" else real
        t0 = time.perf_counter()
        b = grpo.generate_batch(run, g)
        t1 = time.perf_counter()
        grpo.update(run, b)
        t2 = time.perf_counter()
        res[arm].append((b["generation_s"], t1 - t0 - b["generation_s"], t2 - t1))
        print(arm, g, "sample %.2f  score %.2f  update %.2f" % res[arm][-1], flush=True)
for arm, v in res.items():
    print(arm, "medians of batches 2-5: sample %.2f score %.2f update %.2f" % tuple(statistics.median(x[i] for x in v[1:]) for i in range(3)))
