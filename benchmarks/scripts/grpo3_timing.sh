#!/usr/bin/env bash
set -euo pipefail
cd /work/wt-grpo3
export PYTHONPATH=/work/wt-grpo3/src
TL="/work/main/.venv/bin/python -m tunelab.cli"
echo "lock taken $(date -u +%T)"
/usr/bin/time -v $TL train --config runs/g3/main.yaml max_steps=3 output_dir=runs/g3/timing 2>&1 | tail -40
echo "timing done $(date -u +%T)"
$TL eval --model /tmp/sft-start/merged --format alpaca --template compact --data /tmp/sft-start/data/test.jsonl \
  --limit 400 --max-new-tokens 48 --json --out runs/g3/eval-before.json | tail -1
echo "eval done $(date -u +%T)"
