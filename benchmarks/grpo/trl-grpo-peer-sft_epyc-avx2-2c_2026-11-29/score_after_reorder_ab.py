"""Does laying the weights out (prepacked enter/exit, no sampling) before GRPO's scoring pass and update slow them?
One generation batch, then alternately: [prepacked enter+exit] + score + update, and score + update alone."""
import sys, time, statistics, copy, torch
from pathlib import Path
from tunelab.config import load_config
from tunelab.recipes import grpo
from tunelab.model import prepack
cfg = load_config("configs/quickstart-grpo.yaml", ["output_dir=/tmp/g/prof/run3", "lr=1e-12"])
run = grpo.setup(cfg, Path("/tmp/g/prof/run3"))
b = grpo.generate_batch(run, 0)
res = {"plain": [], "after-reorder": []}
for i in range(5):
    for arm in ("plain", "after-reorder"):
        if arm == "after-reorder":
            t = time.perf_counter()
            with prepack.prepacked(run.root.model, 64) as n:
                pass
            tr = time.perf_counter() - t
        else:
            tr, n = 0.0, 0
        t0 = time.perf_counter()
        with torch.no_grad():
            for rollout, old, ref, adv in b["micro"]:
                if rollout.rows:
                    run.root.score(rollout, reference=True)
        t1 = time.perf_counter()
        grpo.update(run, b)
        t2 = time.perf_counter()
        res[arm].append((tr, t1 - t0, t2 - t1))
        print(arm, i, n, "reorder %.2f score %.2f update %.2f" % res[arm][-1], flush=True)
for arm, v in res.items():
    print(arm, "medians: reorder %.2f score %.2f update %.2f" % tuple(statistics.median(x[k] for x in v) for k in range(3)))
