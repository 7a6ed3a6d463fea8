"""The tables of benchmarks/grpo/quickstart-grpo-trailing_epyc-avx2-2c_2026-11-29.md: exact match by digit count, steps and
time per run, and wrong answers by kind (grpo_widths.py), against the
SFT start. Usage: grpo_trailing_tables.py TEST.jsonl (the quickstart's runs/quickstart/data/test.jsonl) RUN_DIR [...]"""

import collections
import json
import os
import statistics
import sys

# The rows this reads were removed after commit e457b00 (issue 68: benchmarks/ as records). Read them from a
# checkout of it: `git worktree add /tmp/e457b00 e457b00`, then ROWS=/tmp/e457b00/benchmarks.
ROWS = os.environ.get("ROWS", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
WIDTH = os.path.join(ROWS, "grpo", "quickstart-grpo-width_epyc-avx2-2c_2026-11-29")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grpo_widths import kind  # noqa: E402

TEST, runs = sys.argv[1], sys.argv[2:]
rows = [json.loads(l) for l in open(TEST)]


def acc(d):
    return json.load(open(d + "/eval-after.json"))


b = json.load(open(WIDTH + "/sft-eval.json"))
print("| | SFT start | " + " | ".join(r.split("/")[-1] for r in runs) + " |")
print("|---|" + "---|" * (len(runs) + 1))
line = f"| exact match, 400 held-out additions | {100 * b['accuracy']:.2f}% |"
for r in runs:
    a = acc(r)
    line += f" {100 * a['accuracy']:.2f}% (**{100 * (a['accuracy'] - b['accuracy']):+.2f}**) |"
print(line)
for k in sorted(b["by_digits"], key=int):
    line = f"| {k} digits ({b['by_digits'][k]['n']}) | {100 * b['by_digits'][k]['accuracy']:.1f}% |"
    for r in runs:
        line += f" {100 * acc(r)['by_digits'][k]['accuracy']:.1f}% |"
    print(line)
line = "| steps run (end of the schedule) |  |"
for r in runs:
    m = [json.loads(l) for l in open(r + "/metrics.jsonl")]
    s = json.load(open(r + "/summary.json"))
    line += f" {len(m)}{' (time limit)' if s.get('time_limited') else ''} |"
print(line)
line = "| training time, median batch |  |"
for r in runs:
    m = [json.loads(l) for l in open(r + "/metrics.jsonl")]
    bt = [y["elapsed_s"] - x["elapsed_s"] for x, y in zip(m, m[1:])]
    line += f" {m[-1]['elapsed_s']:.0f} s, {statistics.median(bt):.1f} s |"
print(line)
line = "| learning rate at the last step |  |"
for r in runs:
    m = [json.loads(l) for l in open(r + "/metrics.jsonl")]
    line += f" {m[-1]['lr']:.1e} |"
print(line)
print()
print("| wrong answers | SFT | " + " | ".join(r.split("/")[-1].split("-")[0] for r in runs) + " |")
print("|---|" + "---|" * (len(runs) + 1))


def kinds(path):
    c = collections.Counter()
    for row, l in zip(rows, open(path)):
        c[max(len(str(row["a"])), len(str(row["b"]))), kind(row, json.loads(l))] += 1
    return c


cs = [kinds(WIDTH + "/sft-predictions.jsonl")] + [kinds(r + "/eval-after-predictions.jsonl") for r in runs]
for lo, hi, label in ((5, 7, "5-7 digits"), (8, 8, "8 digits"), (2, 8, "2-8 digits")):
    line = f"| {label}: one zero short / one too many or cut |"
    for c in cs:
        s = sum(c[d, "-1"] for d in range(lo, hi + 1))
        t = sum(c[d, "+1"] + c[d, "cut"] for d in range(lo, hi + 1))
        line += f" {s} / {t} |"
    print(line)
line = "| 2-8 digits: aligned, summed wrong |"
for c in cs:
    line += f" {sum(c[d, 'add'] for d in range(2, 9))} |"
print(line)
