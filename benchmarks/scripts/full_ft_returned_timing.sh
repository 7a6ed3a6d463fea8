#!/bin/bash
# 8-bit AdamW, 16 steps, alternated three times: BASE (a worktree of main before the pre-step return, e2f8653)
# against this checkout. Plain `tunelab train` (no tracing); the median step leaves out the first two.
BASE=${BASE:?a worktree of the code before}
HERE=$(git rev-parse --show-toplevel)
OUT=${OUT:-/tmp/returned-before-step-timing}
PY=${PY:-python}
[ -f $OUT/train.jsonl ] || (cd $HERE && $PY -m tunelab data arithmetic --out $OUT/train.jsonl --n 2000 --response aligned --seed 0)
common="method=full data.path=$OUT/train.jsonl seq_len=128 micro_batch=4 max_steps=16 lr=1e-4 log_steps=1 compile=false max_grad_norm=0 warmup_ratio=0.1 optimizer=adamw_8bit"
for rep in 1 2 3; do for code in base main; do
  d=$BASE; [ $code = main ] && d=$HERE
  (cd $d && rm -rf $OUT/$code-$rep && PYTHONPATH=src $PY -m tunelab train --config configs/quickstart.yaml $common output_dir=$OUT/$code-$rep --quiet)
done; done
