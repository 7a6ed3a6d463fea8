"""The tables of benchmarks/optimizers/full-ft-peak-phase_epyc-avx2-2c_2026-11-29.md: per full fine-tuning mode, plan before and
after against the RSS above the start, and where the RSS beyond plan's modelled terms sits. Rows of this folder
(2-core Zen 3, AVX2) and of benchmarks/optimizers/full-ft-returned-before-step_xeon-fp32-2c_2026-11-28/8steps (2-core Xeon, AVX-512F)."""

import json
import os

G = 2**30
# The rows this reads were removed after commit e457b00 (issue 68: benchmarks/ as records). Read them from a
# checkout of it: `git worktree add /tmp/e457b00 e457b00`, then ROWS=/tmp/e457b00/benchmarks.
ROWS = os.environ.get("ROWS", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
HERE = os.path.join(ROWS, "optimizers", "full-ft-peak-phase_epyc-avx2-2c_2026-11-29")
XEON = os.path.join(ROWS, "optimizers", "full-ft-returned-before-step_xeon-fp32-2c_2026-11-28", "8steps")
MODES = ("adafactor", "adamw_8bit", "adafactor-bf16")


def mode_row(folder: str, mode: str, before: str) -> dict:
    """plan's memory does not depend on the CPU class or max_steps: the plan now of this folder's rows serves all."""
    rows = [json.loads(line) for line in open(f"{folder}/{mode}.jsonl")]
    steps = [r for r in rows if "live_peak_gib" in r][1:]  # the first step holds the warm-up
    plan = json.load(open(f"{folder}/{mode}.{before}.json"))
    after = json.load(open(f"{HERE}/rows/{mode}.plan-after.json"))
    b = {k: v / G for k, v in plan["memory_breakdown"].items()}
    at = max(steps, key=lambda r: r["rss_peak_gib"])
    mapped = at["smaps"].get("file:model.safetensors rss", 0.0)  # fp32 weights are mapped from the file
    return {
        "plan": plan["peak_memory_bytes"] / G,
        "after": after["peak_memory_bytes"] / G,
        "rss": rows[-1]["peak_memory_bytes"] / G,
        "modelled": plan["peak_memory_bytes"] / G - b["runtime_overhead"],
        "moment": "step (gradients)" if b["gradients"] > b["activations"] else "backward (activations)",
        "not_live": at["rss_peak_gib"] - at["live_peak_gib"] - mapped,
    }


SETS = (
    ("Zen 3, AVX2, 8 steps", f"{HERE}/rows", "plan-before", MODES),
    ("Xeon, AVX-512F, 8 steps", XEON, "plan", MODES),
    ("Xeon, AVX-512F, 48 steps", XEON.replace("8steps", "48steps"), "plan", ("adamw_8bit",)),
)
for label, folder, before, modes in SETS:
    print(f"\n{label}\n")
    print(
        "| mode | plan's peak moment | RSS above start | plan before | vs RSS | plan now | vs RSS | RSS beyond plan's terms | RSS not live at the peak |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for m in modes:
        r = mode_row(folder, m, before)
        print(
            f"| {m} | {r['moment']} | {r['rss']:.3f} | {r['plan']:.3f} | {(r['plan'] - r['rss']) / r['rss']:+.1%} | "
            f"{r['after']:.3f} | {(r['after'] - r['rss']) / r['rss']:+.1%} | {r['rss'] - r['modelled']:.3f} | {r['not_live']:.3f} |"
        )
