#!/usr/bin/env bash
# Code that inductor compiled under an instruction-set cap (ATEN_CPU_CAPABILITY=avx2), loaded from the same cache by a
# later uncapped run: does the uncapped run's backward survive? Six fp32 compiled steps of a config (default: the
# quickstart run's config.yaml) capped, then uncapped, into CACHE (a fresh folder per call). With FIXED=1 the cache is
# left to tunelab (libraries.isolate_compile_cache), which keeps capped runs apart; else TORCHINDUCTOR_CACHE_DIR forces
# both into one. Usage: [FIXED=1] inductor_cache_caps.sh [CONFIG]
set -uo pipefail
CFG=${1:-runs/quickstart/config.yaml}
PY=${PYTHON:-.venv/bin/python}
CACHE=$(mktemp -d /tmp/inductor-caps-XXXX)
for side in capped uncapped; do
  caps=(); [ $side = capped ] && caps=(ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2)
  shared=(TORCHINDUCTOR_CACHE_DIR="$CACHE"); [ "${FIXED:-0}" = 1 ] && shared=()
  env "${caps[@]}" "${shared[@]}" "$PY" -m tunelab.cli train --config "$CFG" max_steps=6 max_minutes=0 \
    schedule_within_limit=false save_steps=0 log_steps=1 precision=fp32 compile=true output_dir="$CACHE/run-$side" \
    > "$CACHE/$side.log" 2>&1
  echo "$side: exit $?"
done
