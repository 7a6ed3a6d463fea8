#!/usr/bin/env bash
# plan beside a real GRPO run on this CPU (issue 66): a short GRPO run of configs/quickstart-grpo.yaml's shape on the
# embedded SmolLM2 (a few steps; the knobs as the quickstart's: 8 prompts x G 8 per step, cap 40, beta 0.1), then
# `tunelab plan --gpu local` for the run's own config.yaml, as JSON. Writes into OUT (default runs/grpo-plan-measure).
# Usage (under the CPU lock): benchmarks/scripts/grpo_plan_measure.sh [OUT] [extra train overrides...]
set -euo pipefail
OUT=${1:-runs/grpo-plan-measure}
shift || true
PY=${PYTHON:-python}
TL=("$PY" -m tunelab)
mkdir -p "$OUT"
"${TL[@]}" data arithmetic --prompts --n 400 --digits 3-8 --templates plain --seed 1 --out "$OUT/prompts.jsonl" >/dev/null
/usr/bin/time -v "${TL[@]}" train --config configs/quickstart-grpo.yaml model=embedded data.path="$OUT/prompts.jsonl" \
  output_dir="$OUT/run" max_steps=6 max_minutes=0 schedule_within_limit=false save_steps=0 "$@" \
  >"$OUT/train-output.txt" 2>"$OUT/time.txt"
tail -3 "$OUT/train-output.txt"
grep -E "Maximum resident|Elapsed" "$OUT/time.txt"
"${TL[@]}" plan --config "$OUT/run/config.yaml" --gpu local --json >"$OUT/plan.json"
"${TL[@]}" plan --config "$OUT/run/config.yaml" --gpu local
