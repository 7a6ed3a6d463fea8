#!/usr/bin/env bash
set -euo pipefail
cd /work/wt-grpo3
export PYTHONPATH=/work/wt-grpo3/src
TL="/work/main/.venv/bin/python -m tunelab.cli"
echo "lock taken $(date -u +%T) commit $(git rev-parse --short HEAD)"
$TL train --config runs/g3/main.yaml 2>&1 | tail -40
echo "train done $(date -u +%T)"
$TL eval --adapter runs/g3/main/adapter --data /tmp/sft-start/data/test.jsonl \
  --limit 400 --max-new-tokens 48 --json --out runs/g3/main/eval-after.json | tail -1
echo "eval done $(date -u +%T)"
$TL train --config runs/g3/check.yaml 2>&1 | tail -8
echo "check done $(date -u +%T)"
$TL plan --config runs/g3/main.yaml --gpu local > runs/g3/plan-main-before-fit.txt 2>&1 || true
$TL plan --config runs/g3/check.yaml --gpu local > runs/g3/plan-check-before-fit.txt 2>&1 || true
/work/main/.venv/bin/python benchmarks/scripts/plan_grpo.py --fit runs/g3/main --check runs/g3/check --write \
  --out runs/g3/plan-grpo-fit.md 2>&1 | tail -20
$TL plan --config runs/g3/main.yaml --gpu local > runs/g3/plan-main-after-fit.txt 2>&1 || true
echo "fit done $(date -u +%T)"
