#!/bin/bash
# live and RSS peaks per step for every full fine-tuning mode, with plan's JSON beside each
cd "$(git rev-parse --show-toplevel)"
OUT=${OUT:-/tmp/full-ft-live-peaks}
PY=${PY:-python}
[ -f $OUT/train.jsonl ] || $PY -m tunelab data arithmetic --out $OUT/train.jsonl --n 2000 --response aligned --seed 0
common="method=full data.path=$OUT/train.jsonl seq_len=128 micro_batch=4 max_steps=${STEPS:-8} lr=1e-4 log_steps=1 compile=false max_grad_norm=0 warmup_ratio=0.1"
declare -A S=([adamw]="" [adamw_8bit]="optimizer=adamw_8bit" [adafactor]="optimizer=adafactor" [adamw-bf16-stochastic]="weights=bf16" [adamw-in-backward]="optimizer_in_backward=true" [adamw_8bit-in-backward-bf16]="optimizer=adamw_8bit optimizer_in_backward=true weights=bf16" [adamw_8bit-in-backward]="optimizer=adamw_8bit optimizer_in_backward=true" [adafactor-bf16]="optimizer=adafactor weights=bf16")
for name in ${RUNS:-adamw_8bit adafactor adamw-bf16-stochastic adamw adafactor-bf16 adamw_8bit-in-backward}; do
  rm -rf $OUT/$name
  LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1,oversize_threshold:0 \
   PYTHONPATH=src $PY benchmarks/scripts/step_memory.py --config configs/quickstart.yaml $common output_dir=$OUT/$name ${S[$name]} --quiet > $OUT/$name.jsonl 2> $OUT/$name.err || echo "$name failed"
  $PY -m tunelab plan --config configs/quickstart.yaml --gpu local --json $common output_dir=$OUT/$name ${S[$name]} > $OUT/$name.plan.json 2>>$OUT/$name.err
  echo "$name done $(date +%T)"
done
