"""plan beside each mode's measured peaks: RSS above the start (8 steps here, 48 in the 48-step table) and jemalloc's
live peak. DATA: the 2,000 rows of `tunelab data arithmetic --n 2000 --response aligned --seed 0`; run from the repo root."""

import json
import os
import subprocess
import sys

G = 2**30
# The rows this reads were removed after commit e457b00 (issue 68: benchmarks/ as records). Read them from a
# checkout of it: `git worktree add /tmp/e457b00 e457b00`, then ROWS=/tmp/e457b00/benchmarks.
ROWS = os.environ.get("ROWS", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROWS, "optimizers", "full-ft-live-peaks_xeon-fp32-2c_2026-11-28")
DATA = os.environ.get("DATA", "/tmp/s6/mem/train.jsonl")
common = f"method=full data.path={DATA} seq_len=128 micro_batch=4 max_steps=8 lr=1e-4 log_steps=1 compile=false max_grad_norm=0 warmup_ratio=0.1".split()
# (run name, overrides): the names are run labels, not a dispatch on the optimizer registry
S = [
    ("adamw", ""),
    ("adamw_8bit", "optimizer=adamw_8bit"),
    ("adafactor", "optimizer=adafactor"),
    ("adamw-bf16-stochastic", "weights=bf16"),
    ("adafactor-bf16", "optimizer=adafactor weights=bf16"),
    ("adamw_8bit-in-backward", "optimizer=adamw_8bit optimizer_in_backward=true"),
    ("adamw_8bit-in-backward-bf16", "optimizer=adamw_8bit optimizer_in_backward=true weights=bf16"),
    ("adamw-in-backward", "optimizer_in_backward=true"),
]
old = os.path.join(OUT, "..", "optimizers-48steps_xeon-fp32-2c_2026-11-28")
for n, extra in S:
    p = json.loads(
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tunelab",
                "plan",
                "--config",
                "configs/quickstart.yaml",
                "--gpu",
                "local",
                "--json",
                *common,
                *extra.split(),
            ],
            capture_output=True,
            text=True,
        ).stdout.splitlines()[0]
    )
    b = p["memory_breakdown"]
    tot = p["peak_memory_bytes"] / G
    meas = {}
    try:
        rows = [json.loads(l) for l in open(f"{OUT}/{n}.jsonl")]
        meas["rss8"] = rows[-1]["peak_memory_bytes"] / G
        meas["live8"] = max(r["live_peak_gib"] for r in rows if "step" in r)
    except FileNotFoundError:
        pass
    try:
        meas["rss48"] = json.load(open(f"{old}/{n}/summary.json"))["peak_memory_bytes"] / G
    except FileNotFoundError:
        pass
    errs = " ".join(f"{k} {v:.2f} ({(tot - v) / v:+.0%})" for k, v in meas.items() if k.startswith("rss"))
    print(
        f"{n:28s} plan {tot:.2f} [{' '.join(f'{k[:5]}={v / G:.2f}' for k, v in b.items())}] | {errs} live8 {meas.get('live8', 0):.2f}"
    )
