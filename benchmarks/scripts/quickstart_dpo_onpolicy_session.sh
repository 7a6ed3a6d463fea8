#!/usr/bin/env bash
# Measured session 1 (under the CPU lock): on-policy pairs from the SFT start, then DPO (shipped schedule) and ORPO
set -euo pipefail
cd /work/wt-dpo3
TL="env PYTHONPATH=/work/wt-dpo3/src /work/main/.venv/bin/python -m tunelab.cli"
R=/tmp/dpo3
TEST=/tmp/sft-start/data/test.jsonl
stamp() { echo "$1 $(date +%s) $(date -u +%T)" >> $R/timings.txt; }
stamp start
$TL data pairs --data /tmp/sft-start/data/train.jsonl --model /tmp/sft-start/merged --format alpaca --template compact \
  --limit 320 --samples 2 --temperature 1.0 --seed 0 --out $R/pairs.jsonl 2>&1 | tee $R/pairs-output.txt
stamp pairs
$TL train --config configs/quickstart-dpo.yaml model=/tmp/sft-start/merged data.path=$R/pairs.jsonl \
  output_dir=$R/dpo-a 2>&1 | tee $R/dpo-a-train.txt
stamp train-dpo-a
$TL eval --adapter $R/dpo-a/adapter --data $TEST --json --out $R/dpo-a-eval.json --predictions $R/dpo-a-pred.jsonl | tail -1
stamp eval-dpo-a
$TL train --config configs/quickstart-dpo.yaml model=/tmp/sft-start/merged data.path=$R/pairs.jsonl \
  objective=orpo preference.precompute_reference=false output_dir=$R/orpo-b 2>&1 | tee $R/orpo-b-train.txt
stamp train-orpo-b
$TL eval --adapter $R/orpo-b/adapter --data $TEST --json --out $R/orpo-b-eval.json --predictions $R/orpo-b-pred.jsonl | tail -1
stamp eval-orpo-b
# Run 3 only if it ends before the report is due (about 7 minutes from here).
if [ "$(date +%s)" -lt "$(date -d 2026-11-28T00:55:00Z +%s)" ]; then
$TL train --config configs/quickstart-dpo.yaml model=/tmp/sft-start/merged data.path=$R/pairs.jsonl \
  lr=5e-5 output_dir=$R/dpo-c 2>&1 | tee $R/dpo-c-train.txt
stamp train-dpo-c
$TL eval --adapter $R/dpo-c/adapter --data $TEST --json --out $R/dpo-c-eval.json --predictions $R/dpo-c-pred.jsonl | tail -1
stamp eval-dpo-c
else stamp skipped-dpo-c; fi
# The tests that need the embedded model (not timed): on-policy pairs into a DPO run, and eval after its loading moved.
timeout 600 env PYTHONPATH=/work/wt-dpo3/src /work/main/.venv/bin/python -m pytest -q -p no:cacheprovider \
  tests/integration/test_pairs_embedded.py tests/integration/test_eval_embedded.py > $R/tests.txt 2>&1 || true
stamp tests
