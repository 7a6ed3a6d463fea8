#!/bin/bash
# The RSS and jemalloc's counters at each step's RSS high (peak_probe.py), 16 steps of fp32 AdamW and 8-bit AdamW,
# with (PURGE=1: freed pages returned in an optimizer-step pre-hook) and without, alternated twice. Ran on main
# e2f8653, before the hook was in the code; the sampler thread slows the steps, so their times are not comparable.
cd "$(git rev-parse --show-toplevel)"
OUT=${OUT:-/tmp/peak-probe}
PY=${PY:-python}
HERE=benchmarks/scripts
[ -f $OUT/train.jsonl ] || $PY -m tunelab data arithmetic --out $OUT/train.jsonl --n 2000 --response aligned --seed 0
common="method=full data.path=$OUT/train.jsonl seq_len=128 micro_batch=4 max_steps=16 lr=1e-4 log_steps=1 compile=false max_grad_norm=0 warmup_ratio=0.1"
for rep in 1 2; do for purge in 0 1; do for mode in "adamw_8bit optimizer=adamw_8bit" "adamw "; do
  set -- $mode; name=$1-p$purge-$rep; shift
  rm -rf $OUT/$name
  PURGE=$purge LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1,oversize_threshold:0 \
   PYTHONPATH=src $PY $HERE/peak_probe.py --config configs/quickstart.yaml $common output_dir=$OUT/$name "$@" --quiet > $OUT/$name.probe.jsonl 2> $OUT/$name.probe.err
done; done; done
