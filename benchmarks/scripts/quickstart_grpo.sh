#!/usr/bin/env bash
# GRPO after `make demo` (configs/quickstart-grpo.yaml): merge the quickstart's adapter into the base, write
# addition prompts with their answers, score exact match on the quickstart's held-out additions before, train
# GRPO rewarded by the exact sum, score again. Writes everything into OUT (default runs/quickstart-grpo-result).
# Usage: [PROMPTS=4000] [EVAL_LIMIT=400] benchmarks/scripts/quickstart_grpo.sh [OUT] [extra train overrides...]
set -euo pipefail
OUT=${1:-runs/quickstart-grpo-result}
shift || true
source "$(dirname "$0")/quickstart_after.sh"
# One generation cap for both scores: the rows' `output` would otherwise budget the merged model's responses.
LIMIT=(--limit "${EVAL_LIMIT:-400}" --max-new-tokens "${EVAL_CAP:-48}")
rm -f runs/quickstart-grpo/prompts.jsonl
$TL data arithmetic --prompts --n "${PROMPTS:-4000}" --digits 1-8 --templates plain --seed 1 \
  --out runs/quickstart-grpo/prompts.jsonl
stamp prompts
$TL eval --model runs/quickstart/merged --format alpaca --template compact \
  --data runs/quickstart/data/test.jsonl "${LIMIT[@]}" --json --out "$OUT/eval-before.json" | tail -1
stamp eval_before
$TL train --config configs/quickstart-grpo.yaml "$@" 2>&1 | tee "$OUT/train-output.txt"
stamp trained
$TL eval --adapter runs/quickstart-grpo/adapter --data runs/quickstart/data/test.jsonl "${LIMIT[@]}" --json \
  --out "$OUT/eval-after.json" | tail -1
stamp eval_after
cp runs/quickstart-grpo/{config.yaml,summary.json,metrics.jsonl,completions.jsonl} "$OUT/"
cat "$OUT/timings.txt"
