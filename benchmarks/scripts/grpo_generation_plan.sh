#!/usr/bin/env bash
# The measurements of benchmarks/grpo/grpo-generation-plan_epyc-avx512bf16-2c_2026-12-07.md (issue 66), each under the
# CPU lock, into OUT (default runs/grpo-generation-plan):
#   1. decode tokens/s per decode mode, sampling from an eager and from a compiled policy, against the bandwidth
#      roofline (decode_roofline.py), at the quickstart's generation batch (8 prompts x G 8, 40 tokens);
#   2. a compiled policy sampling with its adapter packed for the call against unpacked (decode_compiled_policy_ab.py);
#   3. plan beside a short GRPO run of the quickstart's shape on the embedded model, bf16 and fp32
#      (grpo_plan_measure.sh), then plan again with the run as its trial (--from-run) and at the cap;
#   4. tunelab vs TRL's GRPOTrainer at equal completions per step (bench peers trl-grpo).
# OLD_SRC=DIR repeats step 1 with the code before (a `git archive` of src/ at the base commit) for comparison.
set -euo pipefail
OUT=${1:-runs/grpo-generation-plan}
PY=${PYTHON:-python}
LOCK=(flock /tmp/tunelab-cpu.lock)
mkdir -p "$OUT"
DECODE=(embedded --rows 64 --prompts 8 --prompt-tokens 24 --tokens 40 --decode dynamic,static,compiled --policy eager,compiled)
"${LOCK[@]}" "$PY" benchmarks/scripts/decode_roofline.py "${DECODE[@]}" >"$OUT/decode.jsonl"
if [ -n "${OLD_SRC:-}" ]; then
  "${LOCK[@]}" env PYTHONPATH="$OLD_SRC" "$PY" benchmarks/scripts/decode_roofline.py embedded --rows 64 --prompts 8 \
    --prompt-tokens 24 --tokens 40 --decode dynamic,static --policy eager,compiled >"$OUT/decode-before.jsonl"
fi
for precision in bf16 fp32; do
  "${LOCK[@]}" "$PY" benchmarks/scripts/decode_compiled_policy_ab.py --precision $precision >"$OUT/compiled-policy-ab-$precision.jsonl"
done
for shape in bf16:6 fp32:5; do
  precision=${shape%:*} run="$OUT/grpo-${shape%:*}"
  "${LOCK[@]}" env PYTHON="$PY" bash benchmarks/scripts/grpo_plan_measure.sh "$run" precision=$precision max_steps=${shape#*:}
  for how in "--from-run $run/run" "--completion-tokens ${CAP:-40}"; do
    # shellcheck disable=SC2086
    "${LOCK[@]}" "$PY" -m tunelab plan --config "$run/run/config.yaml" --gpu local --json $how >>"$run/plans.jsonl"
  done
done
sed "s|path: .*prompts.jsonl|path: $OUT/grpo-bf16/prompts.jsonl|" benchmarks/grpo/grpo-generation-plan_epyc-avx512bf16-2c_2026-12-07/peer.yaml \
  >"$OUT/peer.yaml"
"${LOCK[@]}" "$PY" -m tunelab bench peers trl-grpo --config "$OUT/peer.yaml" --rounds 1 --steps 3 --warmup 1 --json \
  --db "$OUT/bench.sqlite" >"$OUT/peer.jsonl"
