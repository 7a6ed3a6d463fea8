#!/usr/bin/env bash
# Preference tuning after `make demo` (CONFIG: configs/quickstart-orpo.yaml, or configs/quickstart-dpo.yaml):
# merge the quickstart's adapter into the base, sample the merged SFT model on PROMPTS of its own training
# additions (SAMPLES each) and pair every wrong answer against the correct one (`tunelab data pairs`), score exact
# match on the quickstart's held-out additions before, train, score again. Writes everything into OUT (default
# runs/quickstart-dpo-result).
# Usage: [CONFIG=...] [PROMPTS=320] [SAMPLES=2] [EVAL_LIMIT=400] benchmarks/scripts/quickstart_dpo.sh [OUT] [train overrides...]
set -euo pipefail
OUT=${1:-runs/quickstart-dpo-result}
shift || true
source "$(dirname "$0")/quickstart_after.sh"
CONFIG=${CONFIG:-configs/quickstart-orpo.yaml}
RUN=$(sed -n 's/^output_dir: *//p' "$CONFIG")
PROMPTS=${PROMPTS:-320}
SAMPLES=${SAMPLES:-2}
LIMIT=(--limit "${EVAL_LIMIT:-400}")
rm -f runs/quickstart/data/pairs.jsonl
$TL data pairs --data runs/quickstart/data/train.jsonl --model runs/quickstart/merged --format alpaca \
  --template compact --limit "$PROMPTS" --samples "$SAMPLES" --temperature 1.0 --seed 0 \
  --out runs/quickstart/data/pairs.jsonl | tee "$OUT/pairs-output.txt"
stamp pairs
$TL eval --model runs/quickstart/merged --format alpaca --template compact \
  --data runs/quickstart/data/test.jsonl "${LIMIT[@]}" --json --out "$OUT/eval-before.json" | tail -1
stamp eval_before
$TL train --config "$CONFIG" "$@" 2>&1 | tee "$OUT/train-output.txt"
stamp trained
$TL eval --adapter "$RUN/adapter" --data runs/quickstart/data/test.jsonl "${LIMIT[@]}" --json \
  --out "$OUT/eval-after.json" | tail -1
stamp eval_after
cp "$RUN"/{config.yaml,summary.json,metrics.jsonl} "$OUT/"
cat "$OUT/timings.txt"
