#!/usr/bin/env bash
# Longer runs than optimizers.sh (STEPS, default 64) for the modes whose 8-step curves differ (fp32 AdamW, bf16
# weights with stochastic rounding and with Kahan, 8-bit AdamW, Adafactor), then each model's held-out exact
# match on optimizers.sh's 100 test rows. Each run's metrics.jsonl and summary.json under $OUT/<name>/, the
# scores in $OUT/<name>.eval.json. LR, WARMUP (ratio) and TEST_N (held-out rows) default to the 10-step table's;
# EVAL_STEPS > 0 also logs the held-out loss on those rows every EVAL_STEPS steps (eval_loss in metrics.jsonl).
#   OUT=/tmp/optim-long STEPS=64 flock /tmp/tunelab-cpu.lock benchmarks/scripts/optimizers_long.sh
set -euo pipefail
OUT=${OUT:-/tmp/optim-long}
STEPS=${STEPS:-64}
LR=${LR:-2e-5}
WARMUP=${WARMUP:-0}
TEST_N=${TEST_N:-100}
EVAL_STEPS=${EVAL_STEPS:-0}
PY=${PY:-python}
RUNS=${RUNS:-"adamw adamw-bf16-nearest adamw-bf16-stochastic adamw-bf16-kahan adamw_8bit adafactor"}
mkdir -p "$OUT"
[ -f "$OUT/train.jsonl" ] || $PY -m tunelab data arithmetic --out "$OUT/train.jsonl" --n 2000 --response aligned \
  --test-out "$OUT/test.jsonl" --test-n "$TEST_N" --seed 0
common=(method=full "data.path=$OUT/train.jsonl" seq_len=128 micro_batch=4 "max_steps=$STEPS" "lr=$LR"
  log_steps=1 compile=false max_grad_norm=0 "warmup_ratio=$WARMUP")
[ "$EVAL_STEPS" -gt 0 ] && common+=("eval.path=$OUT/test.jsonl" "eval.steps=$EVAL_STEPS" eval.keep_best=false)
declare -A SETTINGS=(
  [adamw]="" [adamw-bf16-nearest]="weights=bf16 bf16_update=nearest" [adamw-bf16-stochastic]="weights=bf16" [adamw-bf16-kahan]="weights=bf16 bf16_update=kahan"
  [adamw_8bit]="optimizer=adamw_8bit" [adafactor]="optimizer=adafactor"
  [adamw-in-backward]="optimizer_in_backward=true"
  [adamw_8bit-in-backward-bf16]="optimizer=adamw_8bit optimizer_in_backward=true weights=bf16"
)
for name in $RUNS; do
  rm -rf "${OUT:?}/$name"
  # shellcheck disable=SC2086
  $PY -m tunelab train --config configs/quickstart.yaml "${common[@]}" "output_dir=$OUT/$name" ${SETTINGS[$name]} \
    --quiet > "$OUT/$name.log" 2>&1 || { echo "$name failed"; tail -3 "$OUT/$name.log"; continue; }
  $PY -m tunelab eval --model "$OUT/$name/model" --data "$OUT/test.jsonl" --format alpaca --template compact --json \
    > "$OUT/$name.eval.json" 2> "$OUT/$name.eval.log" || echo "$name eval failed"
done
