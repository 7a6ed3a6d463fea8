"""Where the quickstart model's additions go wrong, from `tunelab eval --predictions` files: per digit count of the
longer operand, right; restated aligned but summed wrong ("add"); the shorter operand padded one zero too few (-1)
or too many (+1, or cut to fit 8 columns: "cut"). Usage: widths.py TEST.jsonl PREDICTIONS.jsonl [...]"""

import collections
import json
import re
import sys

EXPR = re.compile(r"\s*(\d+) \+ (\d+) = ?(\d*)")
KINDS = ("right", "add", "-1", "+1", "cut", "other")


def kind(row: dict, pred: dict) -> str:
    a, b = int(row["a"]), int(row["b"])
    width = max(len(str(a)), len(str(b)))
    if pred["correct"]:
        return "right"
    m = EXPR.match(pred["response"])
    if not m:
        return "other"
    x, y = m.group(1), m.group(2)
    if (int(x), int(y)) != (a, b):
        return "cut" if max(len(x), len(y)) == width else "other"
    short = x if len(str(a)) < len(str(b)) else y
    if len(str(a)) == len(str(b)) or len(short) == width:
        return "add" if len(x) == len(y) == width else "other"
    return f"{len(short) - width:+d}" if abs(len(short) - width) == 1 else "other"


def main(test: str, *files: str) -> None:
    rows = [json.loads(line) for line in open(test)]
    for path in files:
        counts = collections.Counter()
        for row, line in zip(rows, open(path)):
            counts[max(len(str(row["a"])), len(str(row["b"]))), kind(row, json.loads(line))] += 1
        print(path)
        print("| digits | " + " | ".join(KINDS) + " |")
        for d in sorted({d for d, _ in counts}):
            print(f"| {d} | " + " | ".join(str(counts[d, k]) for k in KINDS) + " |")


if __name__ == "__main__":
    main(*sys.argv[1:])
