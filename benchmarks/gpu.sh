#!/usr/bin/env bash
# The gpu benchmark suite on a CUDA machine whose Python already has torch, transformers, peft and accelerate.
# Wheels in .whl/ (benchmarks/gpu_prepare.sh downloads them) go to /tmp/site without dependencies, so the
# machine's own CUDA build of torch stays; tunelab runs from src/. `random:` models take their tokenizer from
# build/gpu-cache when the embedded model's package is absent. Writes $OUT/gpu_<device>_<date>.{json,md}.
# `benchmarks/gpu.sh tests` runs the gpu test tier instead (every test marked gpu: tests/gpu and the CUDA
# variants of unit tests); `benchmarks/gpu.sh profile [MODEL [METHOD [key=value ...]]]` measures one point of
# the suite's workload (default the 8B LoRA row at micro-batch 2) and profiles it (bench --profile) into $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
if [ -d build/gpu-cache ] && [ -z "${TUNELAB_CACHE:-}" ]; then export TUNELAB_CACHE=$PWD/build/gpu-cache; fi
if [ "${1:-}" = "tests" ]; then  # the gpu test tier instead of the suite: benchmarks/gpu.sh tests [pytest args]
  shift
  exec "$PY" -m pytest -q -p no:cacheprovider --continue-on-collection-errors -m gpu tests "$@"
fi
if [ "${1:-}" = "profile" ]; then  # benchmarks/gpu.sh profile [MODEL [METHOD [key=value ...]]]: one row, profiled
  shift
  model=random:llama-3.1-8b method=lora
  if [ $# -gt 0 ] && [[ "$1" != *=* ]]; then model=$1; shift; fi
  if [ $# -gt 0 ] && [[ "$1" != *=* ]]; then method=$1; shift; fi
  data=${TMPDIR:-/tmp}/tunelab-profile-data.jsonl
  # The gpu suite's workload and shared settings (bench/suites.yaml).
  "$PY" -m tunelab.cli data synthetic --rows 2000 --prompt-tokens 24-160 --response-tokens 64-1024 --out "$data"
  exec "$PY" -m tunelab.cli bench model="$model" method="$method" data.path="$data" seq_len=2048 packing=true \
    grad_accum=1 lora.r=16 lora.alpha=32 lora.dropout=0.0 lora.targets=all-linear micro_batch=2 "$@" \
    --steps 5 --warmup 2 --json --profile "${OUT:-runs/profile}/profile-${model#random:}-$method"
fi
exec "$PY" -m tunelab.cli bench --suite gpu --out "${OUT:-benchmarks}" "$@"
