#!/bin/bash
# plan's JSON for the three modes with the code as it is (the rows' settings; full_ft_live_peaks.sh)
cd "$(git rev-parse --show-toplevel)"
D=${OUT:-/tmp/full-ft-peak-phase}; mkdir -p $D/rows
DATA=${DATA:-/tmp/full-ft-live-peaks/train.jsonl}
PY=${PY:-python}
common="method=full data.path=$DATA seq_len=128 micro_batch=4 max_steps=8 lr=1e-4 log_steps=1 compile=false max_grad_norm=0 warmup_ratio=0.1"
declare -A S=([adafactor]="optimizer=adafactor" [adafactor-bf16]="optimizer=adafactor weights=bf16" [adamw_8bit]="optimizer=adamw_8bit")
for name in adafactor adafactor-bf16 adamw_8bit; do
  PYTHONPATH=src $PY -m tunelab plan --config configs/quickstart.yaml --gpu local --json $common output_dir=/tmp/plan-after ${S[$name]} > $D/rows/$name.plan-after.json
done
