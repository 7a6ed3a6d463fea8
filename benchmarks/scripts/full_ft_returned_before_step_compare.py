"""The tables of benchmarks/optimizers/full-ft-returned-before-step_xeon-fp32-2c_2026-11-28.md from the rows in this folder: plan against the
RSS peak above the start before (benchmarks/optimizers/full-ft-returned-pages_xeon-fp32-2c_2026-11-28/, freed pages returned 5 s after
a lazy free only) and now (also all at once before a step with scratch); the probe's RSS high per step; the A/B
step times."""

import json
import os
import statistics

G = 2**30
# The rows this reads were removed after commit e457b00 (issue 68: benchmarks/ as records). Read them from a
# checkout of it: `git worktree add /tmp/e457b00 e457b00`, then ROWS=/tmp/e457b00/benchmarks.
ROWS = os.environ.get("ROWS", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
HERE = os.path.join(ROWS, "optimizers", "full-ft-returned-before-step_xeon-fp32-2c_2026-11-28")
BEFORE = os.path.join(ROWS, "optimizers", "full-ft-returned-pages_xeon-fp32-2c_2026-11-28")


def rows(path: str) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def peak(path: str) -> float:
    return rows(path)[-1]["peak_memory_bytes"] / G


def plan(path: str) -> float:
    return json.load(open(path))["peak_memory_bytes"] / G


print("| mode, steps | plan GiB | RSS above start, before | plan vs it | now | plan vs it | live peak now |")
print("|---|---|---|---|---|---|---|")
for mode, steps, before, now in [
    ("adamw_8bit", 8, "returned-after-5s", "8steps"),
    ("adafactor", 8, "returned-after-5s", "8steps"),
    ("adafactor-bf16", 8, "returned-after-5s", "8steps"),
    ("adamw_8bit", 48, "returned-after-5s-48steps", "48steps"),
]:
    p = plan(f"{HERE}/{now}/{mode}.plan.json")
    b, n = peak(f"{BEFORE}/{before}/{mode}.jsonl"), peak(f"{HERE}/{now}/{mode}.jsonl")
    live = max(r.get("live_peak_gib", 0.0) for r in rows(f"{HERE}/{now}/{mode}.jsonl"))
    print(f"| {mode}, {steps} | {p:.2f} | {b:.2f} | {(p - b) / b:+.1%} | {n:.2f} | {(p - n) / n:+.1%} | {live:.2f} |")

print()
print(
    "| probe run | RSS above start | highest RSS | phase of each step's RSS high (steps 2-16) | freed pages held at it, median |"
)
print("|---|---|---|---|---|")
for name in sorted(f for f in os.listdir(f"{HERE}/probe") if f.endswith(".probe.jsonl")):
    steps = rows(f"{HERE}/probe/{name}")
    summary, steps = steps[-1], [r for r in steps[1:-1]]
    phases = {r["phase"] for r in steps}
    held = statistics.median(r["pdirty"] + r["pmuzzy"] for r in steps)
    print(
        f"| {name.removesuffix('.probe.jsonl')} | {summary['peak_memory_bytes'] / G:.2f} "
        f"| {max(r['rss'] for r in steps):.2f} | {', '.join(sorted(phases))} | {held:.2f} |"
    )

print()
print("| run (8-bit AdamW, 16 steps) | median step s | RSS above start | last loss |")
print("|---|---|---|---|")
for name in sorted(f for f in os.listdir(f"{HERE}/timing") if f.endswith(".metrics.jsonl")):
    logged = [r for r in rows(f"{HERE}/timing/{name}") if "loss" in r and "elapsed_s" in r]
    times = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(logged, logged[1:])][2:]
    print(
        f"| {name.removesuffix('.metrics.jsonl')} | {statistics.median(times):.3f} "
        f"| {logged[-1]['peak_memory_bytes'] / G:.2f} | {logged[-1]['loss']:.6f} |"
    )
