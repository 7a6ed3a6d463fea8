#!/usr/bin/env bash
# The gpu benchmark suite on a CUDA machine whose Python already has torch, transformers, peft and accelerate.
# Wheels in .whl/ (benchmarks/gpu_prepare.sh downloads them) go to /tmp/site without dependencies, so the
# machine's own CUDA build of torch stays; tunelab runs from src/. `random:` models take their tokenizer from
# build/gpu-cache when the embedded model's package is absent. Writes $OUT/gpu_<device>_<date>.{json,md}.
# `benchmarks/gpu.sh tests` runs the gpu test tier instead (every test marked gpu: tests/gpu and the CUDA
# variants of unit tests).
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
exec "$PY" -m tunelab.cli bench --suite gpu --out "${OUT:-benchmarks}" "$@"
