#!/usr/bin/env bash
# The quickstart (configs/quickstart.yaml) as a full fine-tune under each optimizer and memory lever, short runs on
# this CPU: each run's metrics.jsonl (the loss curve) and summary.json (peak memory) under $OUT/<name>/.
#   OUT=/tmp/optim-bench STEPS=8 flock /tmp/tunelab-cpu.lock benchmarks/scripts/optimizers.sh
set -euo pipefail
OUT=${OUT:-/tmp/optim-bench}
STEPS=${STEPS:-8}
PY=${PY:-python}
mkdir -p "$OUT"
[ -f "$OUT/train.jsonl" ] || $PY -m tunelab data arithmetic --out "$OUT/train.jsonl" --n 2000 --response aligned \
  --test-out "$OUT/test.jsonl" --test-n 100 --seed 0
common=(method=full "data.path=$OUT/train.jsonl" seq_len=128 micro_batch=4 "max_steps=$STEPS" lr=2e-5
  log_steps=1 compile=false max_grad_norm=0 warmup_ratio=0)
run() {
  local name=$1; shift
  rm -rf "$OUT/$name"
  $PY -m tunelab train --config configs/quickstart.yaml "${common[@]}" "output_dir=$OUT/$name" "$@" --quiet \
    > "$OUT/$name.log" 2>&1 || { echo "$name failed"; tail -3 "$OUT/$name.log"; }
}
run adamw
run adamw-bf16-nearest weights=bf16 bf16_update=nearest
run adamw-bf16-stochastic weights=bf16
run adamw-bf16-kahan weights=bf16 bf16_update=kahan
run adamw_8bit optimizer=adamw_8bit
run adafactor optimizer=adafactor
run adamw-in-backward optimizer_in_backward=true
run adamw_8bit-in-backward-bf16 optimizer=adamw_8bit optimizer_in_backward=true weights=bf16
