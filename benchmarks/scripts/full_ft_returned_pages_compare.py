"""plan beside each full fine-tuning mode's RSS peak above the start (what `tunelab train` reports on CPU) under
three ways of returning freed pages: lazily for ever (the earlier file's rows), for good at once, and lazily then for
good 5 s later (allocator.RETURN_MS, the code now). Also the lazily freed pages left in the RSS at the last step
(smaps' LazyFree). Reads the rows that full_ft_live_peaks.sh wrote into
the folders beside this file."""

import json
import os

G = 2**30
# The rows this reads were removed after commit e457b00 (issue 68: benchmarks/ as records). Read them from a
# checkout of it: `git worktree add /tmp/e457b00 e457b00`, then ROWS=/tmp/e457b00/benchmarks.
ROWS = os.environ.get("ROWS", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
HERE = os.path.join(ROWS, "optimizers", "full-ft-returned-pages_xeon-fp32-2c_2026-11-28")
EARLIER = os.path.join(ROWS, "optimizers", "full-ft-live-peaks_xeon-fp32-2c_2026-11-28")
LAZY = "lazy free (in the RSS until the system needs it)"
MODES = [
    "adamw",
    "adamw_8bit",
    "adafactor",
    "adamw-bf16-stochastic",
    "adafactor-bf16",
    "adamw-in-backward",
    "adamw_8bit-in-backward",
    "adamw_8bit-in-backward-bf16",
]


def rows(folder: str, mode: str) -> list[dict]:
    return [json.loads(line) for line in open(f"{folder}/{mode}.jsonl")]


def cell(plan: float, folder: str, mode: str) -> str:
    rss = rows(folder, mode)[-1]["peak_memory_bytes"] / G
    return f"{rss:.2f} | {(plan - rss) / rss:+.1%}"


print(
    "| mode | plan GiB | RSS above start: lazily for ever (before) | plan vs it | at once | plan vs it "
    "| lazily, for good 5 s later (now) | plan vs it | lazily freed in the RSS at the last step, now | live peak |"
)
print("|---|---|---|---|---|---|---|---|---|---|")
for mode in MODES:
    plan = json.load(open(f"{HERE}/returned-after-5s/{mode}.plan.json"))["peak_memory_bytes"] / G
    now = [r for r in rows(f"{HERE}/returned-after-5s", mode) if r.get("step", 0) > 0]
    print(
        f"| {mode} | {plan:.2f} | {cell(plan, EARLIER, mode)} | {cell(plan, HERE + '/returned-at-once', mode)} "
        f"| {cell(plan, HERE + '/returned-after-5s', mode)} | {now[-1]['smaps'].get(LAZY, 0.0):.2f} "
        f"| {max(r['live_peak_gib'] for r in now):.2f} |"
    )
