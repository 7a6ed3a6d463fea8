#!/usr/bin/env bash
# The measurements of benchmarks/grpo/grpo-bf16-peer_epyc-avx512bf16-2c_2026-12-07.md (issue 66), each under the CPU
# lock, into OUT (default runs/grpo-bf16-peer); OLD_SRC=DIR (a `git archive` of src/ at the base commit) is the code
# before:
#   1. bf16 products over plain and reordered weights at the embedded model's decode shapes (bf16_decode_products.py)
#      and a GRPO micro-batch's attention, flash against explicit products (grpo_update_attention.py);
#   2. tunelab vs TRL's GRPOTrainer (bench peers trl-grpo), the code before (1 round) then this code (2 rounds), on
#      the generation-plan record's peer.yaml with the answer_digits reward (every group's rewards differ: both
#      sides run every update);
#   3. 3 steps of that config with the code before and this code (their losses and completion lengths);
#   4. memory: grpo_memory.py on configs/quickstart-grpo.yaml's shape (embedded model; bf16 6 steps, fp32 5), then
#      plan at the cap and from the run.
set -euo pipefail
OUT=${1:-runs/grpo-bf16-peer}
PY=${PYTHON:-python}
LOCK=(flock /tmp/tunelab-cpu.lock)
OLD=${OLD_SRC:?set OLD_SRC to the code before (src/ of the base commit)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH=$PWD/src
"$PY" -m tunelab data arithmetic --prompts --n 400 --digits 3-8 --templates plain --seed 1 --out "$OUT/prompts.jsonl" >/dev/null
sed -e "s|path: .*prompts.jsonl|path: $OUT/prompts.jsonl|" -e "s|- name: exact_answer|- name: answer_digits|" \
  benchmarks/grpo/grpo-generation-plan_epyc-avx512bf16-2c_2026-12-07/peer.yaml >"$OUT/peer.yaml"
"${LOCK[@]}" "$PY" benchmarks/scripts/bf16_decode_products.py >"$OUT/products.txt"
"${LOCK[@]}" "$PY" benchmarks/scripts/grpo_update_attention.py >"$OUT/attention.txt"
PEER=(-m tunelab bench peers trl-grpo --config "$OUT/peer.yaml" --steps 3 --warmup 1 --json --db "$OUT/bench.sqlite")
"${LOCK[@]}" env PYTHONPATH="$OLD" "$PY" "${PEER[@]}" --rounds 1 >"$OUT/peer-before.jsonl"
"${LOCK[@]}" "$PY" "${PEER[@]}" --rounds 2 >"$OUT/peer-after.jsonl"
for side in before after; do
  src=$PWD/src
  [ $side = before ] && src=$OLD
  "${LOCK[@]}" env PYTHONPATH="$src" "$PY" -m tunelab train --config "$OUT/peer.yaml" max_steps=3 log_steps=1 save_steps=0 \
    output_dir="$OUT/steps-$side" --quiet
done
for shape in bf16:6 fp32:5; do
  prec=${shape%:*} steps=${shape#*:} run="$OUT/memory-${shape%:*}"
  (cd benchmarks/scripts && "${LOCK[@]}" env LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 \
    MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1,oversize_threshold:0 "$PY" grpo_memory.py \
    --config ../../configs/quickstart-grpo.yaml model=embedded data.path="$OUT/prompts.jsonl" output_dir="$run" \
    max_steps="$steps" max_minutes=0 schedule_within_limit=false save_steps=0 precision="$prec" >"$run.jsonl")
  "${LOCK[@]}" "$PY" -m tunelab plan --config "$run/config.yaml" --gpu local --completion-tokens 40 --json >"$run.plan.json"
done
