"""torch's few-row product (model/prepack.py off) against the weights reordered once, side by side in one process
(or alternating processes for `eval`), as measured for benchmarks/design-decisions_cpu_2026-11-29.md. Run from the
repository root with runs/quickstart (the merged SFT model, its held-out data) and runs/quickstart-grpo/prompts.jsonl
in place:

    PYTHONPATH=src python prepack_ab.py sampler [CONFIG]   # generation batches only (default: the peer's peer.yaml)
    PYTHONPATH=src python prepack_ab.py step               # quickstart-grpo: sampling, the reference pass, the update
    PYTHONPATH=src python prepack_ab.py score              # one batch's reference pass and update, after a layout or not
    PYTHONPATH=src python prepack_ab.py eval               # tunelab eval on 200 held-out rows, in fresh processes
"""

import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

PEER = "benchmarks/grpo/trl-grpo-peer-sft_xeon-fp32-2c_2026-11-28/peer.yaml"
QUICKSTART = "configs/quickstart-grpo.yaml"


def grpo_run(config: str, *overrides: str):
    from tunelab.config import load_config
    from tunelab.recipes import grpo

    out = "/tmp/prepack-ab-run"
    return grpo, grpo.setup(load_config(config, [f"output_dir={out}", *overrides]), Path(out))


def update(run, batch) -> None:
    """One optimizer step on a generated batch, as the shared loop takes it (no clipping, no schedule: timing only)."""
    for micro in batch.micro:
        if micro.rollout.rows:
            run.source.forward(run.trainee.loss_fn, micro, run.prep.device).backward()
    run.trainee.optimizer.step()
    run.trainee.optimizer.zero_grad(set_to_none=True)


def arms():
    """(name, prepack.applies for it) for torch's product and the reordered weights."""
    from tunelab.model import prepack

    real = prepack.applies
    return prepack, (("torch", lambda model, rows: False), ("reordered", real))


def alternate(count: int, measure, show) -> dict[str, list]:
    """`measure(g)` for generation batches 0..count-1, each under torch's product and then the reordered weights;
    `show(figures)` is the line printed after each."""
    prepack, both = arms()
    res = {name: [] for name, _ in both}
    for g in range(count):
        for name, applies in both:
            prepack.applies = applies
            res[name].append(measure(g))
            print(name, g, show(res[name][-1]), flush=True)
    return res


def sampler(config: str = PEER) -> None:
    grpo, run = grpo_run(config)

    def measure(g):
        torch.manual_seed(g)
        batch = run.source.generate(g)
        return batch.generation_s, len(batch.samples.ids)

    res = alternate(6, measure, lambda f: f"{f[0]:.2f} {f[1]}")
    for name, v in res.items():
        times = [t for t, _ in v]
        print(name, "median of batches 1-5:", round(statistics.median(times[1:]), 2), [round(t, 2) for t in times])


def step() -> None:
    grpo, run = grpo_run(QUICKSTART)

    def measure(g):
        t0 = time.perf_counter()
        batch = run.source.generate(g)
        t1 = time.perf_counter()
        update(run, batch)
        return batch.generation_s, t1 - t0 - batch.generation_s, time.perf_counter() - t1

    res = alternate(5, measure, lambda f: "sample %.2f  score %.2f  update %.2f" % f)
    for name, v in res.items():
        medians = tuple(statistics.median(x[i] for x in v[1:]) for i in range(3))
        print(name, "medians of batches 2-5: sample %.2f score %.2f update %.2f" % medians)


def score() -> None:
    grpo, run = grpo_run(QUICKSTART, "lr=1e-12")
    prepack, _ = arms()
    batch = run.source.generate(0)
    res = {"plain": [], "after-reorder": []}
    for i in range(5):
        for name in res:
            layers, t = 0, time.perf_counter()
            if name == "after-reorder":
                with prepack.prepacked(run.trainee.model, 64) as layers:
                    pass
            t0 = time.perf_counter()
            with torch.no_grad():
                for micro in batch.micro:
                    if micro.rollout.rows:
                        run.source.root.score(micro.rollout, reference=True)
            t1 = time.perf_counter()
            update(run, batch)
            res[name].append((t0 - t, t1 - t0, time.perf_counter() - t1))
            print(name, i, layers, "reorder %.2f score %.2f update %.2f" % res[name][-1], flush=True)
    for name, v in res.items():
        medians = tuple(statistics.median(x[k] for x in v) for k in range(3))
        print(name, "medians: reorder %.2f score %.2f update %.2f" % medians)


def eval_() -> None:
    args = ["eval", "--model", "runs/quickstart/merged", "--format", "alpaca", "--template", "compact", "--data"]
    args += ["runs/quickstart/data/test.jsonl", "--limit", "200", "--max-new-tokens", "48", "--json"]
    off = (
        "import sys, runpy; from tunelab.model import prepack; prepack.applies = lambda m, r: False; "
        "sys.argv = ['tunelab'] + sys.argv[1:]; runpy.run_module('tunelab.cli', run_name='__main__')"
    )
    for i in range(2):
        for name in ("torch", "reordered"):
            head = [sys.executable, "-c", off] if name == "torch" else [sys.executable, "-m", "tunelab.cli"]
            t = time.perf_counter()
            out = subprocess.run(head + args, capture_output=True, text=True)
            last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-300:]
            print(name, i, f"{time.perf_counter() - t:.1f} s", last[:160], flush=True)


if __name__ == "__main__":
    what, rest = sys.argv[1], sys.argv[2:]
    {"sampler": sampler, "step": step, "score": score, "eval": eval_}[what](*rest)
