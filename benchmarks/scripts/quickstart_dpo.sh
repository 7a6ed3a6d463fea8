#!/usr/bin/env bash
# DPO after `make demo` (configs/quickstart-dpo.yaml): merge the quickstart's adapter into the base, build
# arithmetic pairs (correct sum against a near miss), score exact match on the quickstart's held-out additions
# before, train DPO, score again. Writes everything into OUT (default runs/quickstart-dpo-result).
# Usage: [PAIRS=480] [EVAL_LIMIT=400] benchmarks/scripts/quickstart_dpo.sh [OUT] [extra train overrides...]
set -euo pipefail
OUT=${1:-runs/quickstart-dpo-result}
shift || true
source "$(dirname "$0")/quickstart_after.sh"
PAIRS=${PAIRS:-480}
LIMIT=(--limit "${EVAL_LIMIT:-400}")
rm -f runs/quickstart-dpo/data/pairs.jsonl
$TL data arithmetic --pairs --n "$PAIRS" --digits 1-8 --templates plain --response aligned --seed 1 \
  --out runs/quickstart-dpo/data/pairs.jsonl
stamp pairs
$TL eval --model runs/quickstart/merged --format alpaca --template compact \
  --data runs/quickstart/data/test.jsonl "${LIMIT[@]}" --json --out "$OUT/eval-before.json" | tail -1
stamp eval_before
$TL train --config configs/quickstart-dpo.yaml "$@" 2>&1 | tee "$OUT/train-output.txt"
stamp trained
$TL eval --adapter runs/quickstart-dpo/adapter --data runs/quickstart/data/test.jsonl "${LIMIT[@]}" --json \
  --out "$OUT/eval-after.json" | tail -1
stamp eval_after
cp runs/quickstart-dpo/{config.yaml,summary.json,metrics.jsonl} "$OUT/"
cat "$OUT/timings.txt"
