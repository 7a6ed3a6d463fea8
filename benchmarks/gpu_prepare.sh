#!/usr/bin/env bash
# Run here, before lending the repo to a GPU host that has torch/transformers/peft/accelerate but no package
# index: downloads the wheels the suite needs that such a host lacks into .whl/ (git-ignored), and writes the
# embedded tokenizer (config.json + tokenizer files, no weights) to build/gpu-cache/, which is all `random:`
# models need. Carry `.whl` and `build/gpu-cache` with the call; benchmarks/gpu.sh installs and uses them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WHEELS="datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 bitsandbytes==0.50.2 trl==1.16.0 liger-kernel==0.8.5
  hjson==3.1.0 py-cpuinfo==9.0.0 msgpack==1.2.4 einops==0.8.2 ninja==1.13.2 pydantic==2.14.4 pydantic-core==2.50.5
  annotated-types==0.8.0 typing-inspection==0.4.5 gguf==0.19.0"
mkdir -p .whl build
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl $WHEELS
# DeepSpeed (tests/gpu/test_deepspeed.py) is published as source only: built here into a pure-Python wheel, its
# CUDA ops left to be compiled on first use (DS_BUILD_OPS=0).
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl deepspeed==0.19.8
tokenizer=$("$PY" -c "from tunelab import sources; print(sources.embedded_tokenizer_dir())")
rm -rf build/gpu-cache && mkdir -p build/gpu-cache && cp -r "$tokenizer" build/gpu-cache/
du -sh .whl build/gpu-cache
# The device call carries the repo, .whl and build/gpu-cache together, 64 MiB at most.
total=$(du -cb .whl build/gpu-cache | tail -1 | cut -f1)
if [ "$total" -ge $((60 * 1024 * 1024)) ]; then
  echo "gpu_prepare.sh: .whl and build/gpu-cache hold $total bytes; with the repo the call carries at most 64 MiB" >&2
  exit 1
fi
echo "carry: .whl build/gpu-cache; run: bash benchmarks/gpu.sh (timeout 600 s)"
