#!/bin/bash
# The GRPO quickstart's first 6 generation batches (configs/quickstart-grpo.yaml, seed 1) under three ways of
# handing freed pages back, alternated: each name is a worktree of main e2f8653 (returned-5s: as it was;
# lazily-only: allocator.RETURN_MS = -1; returned-between-phases: lazily only, plus allocator.return_freed_pages()
# before each generation batch and each update, in recipes/grpo.py). Each worktree has runs/quickstart (the
# quickstart's SFT run, merged) and runs/quickstart-grpo/prompts.jsonl (benchmarks/scripts/quickstart_grpo.sh).
declare -A WT=([returned-5s]=$RETURNED [lazily-only]=$LAZY [returned-between-phases]=$PHASES)  # worktree paths
OUT=${OUT:-/tmp/grpo-freed-pages}
PY=${PY:-python}
for pair in "returned-5s 1" "lazily-only 1" "returned-5s 2" "lazily-only 2" "returned-between-phases 1" "lazily-only 3" "returned-between-phases 2" "returned-5s 3"; do
  set -- $pair
  (cd ${WT[$1]} && rm -rf $OUT/$1-$2 && /usr/bin/time -f "%e s wall %U user %S sys %M KB" \
    env PYTHONPATH=src $PY -m tunelab train --config configs/quickstart-grpo.yaml max_steps=6 seed=1 output_dir=$OUT/$1-$2 --quiet)
done
