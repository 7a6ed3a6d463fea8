"""Which held-out sums a GRPO run fixed and which it broke: greedy exact match before and after, row by row
(`tunelab eval`'s predictions files), by the longer operand's digit count (the demo's test.jsonl).

    python benchmarks/scripts/grpo_flips.py --test runs/quickstart/data/test.jsonl \
        --before out/eval-before-predictions.jsonl LABEL=out/eval-after-predictions.jsonl ...
Prints one JSON line per run: right before and after, fixed, broken, and both by digit count.
"""

import argparse
import gzip
import json
from collections import Counter


def rows(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--test", required=True, help="the held-out rows, with digits_a and digits_b")
    parser.add_argument("--before", required=True, help="the SFT start's predictions")
    parser.add_argument("runs", nargs="+", help="LABEL=predictions of a run after GRPO")
    args = parser.parse_args()
    digits = [max(r["digits_a"], r["digits_b"]) for r in rows(args.test)]
    before = [r["correct"] for r in rows(args.before)]
    for spec in args.runs:
        label, _, path = spec.partition("=")
        after = [r["correct"] for r in rows(path)]
        assert len(after) == len(before) == len(digits), f"{label}: {len(after)} rows, {len(before)} before"
        fixed = Counter(d for d, b, a in zip(digits, before, after) if a and not b)
        broken = Counter(d for d, b, a in zip(digits, before, after) if b and not a)
        print(
            json.dumps(
                {
                    "run": label,
                    "right_before": sum(before),
                    "right_after": sum(after),
                    "fixed": sum(fixed.values()),
                    "broken": sum(broken.values()),
                    "fixed_by_digits": dict(sorted(fixed.items())),
                    "broken_by_digits": dict(sorted(broken.items())),
                }
            )
        )


if __name__ == "__main__":
    main()
