#!/usr/bin/env bash
# The quickstart GRPO config trained by the old second trainer (a worktree at OLD, default e457b00) and by the shared
# loop (this tree), fp32 and eager so the two are comparable to the last bit: same completions, same rewards, losses
# equal to float rounding. Needs the quickstart's SFT adapter merged (runs/quickstart/merged, quickstart_after.sh) and
# runs/quickstart-grpo/prompts.jsonl (quickstart_grpo.sh writes it). Usage: [STEPS=6] grpo_engine_equality.sh OLD_TREE
set -euo pipefail
OLD=${1:?the e457b00 worktree}
PY=${PYTHON:-.venv/bin/python}
for side in old new; do
  src=$PWD/src cfg=configs/quickstart-grpo.yaml sched=schedule_within_limit=false
  if [ $side = old ]; then src=$OLD/src cfg=$OLD/configs/quickstart-grpo.yaml sched=grpo.schedule_within_limit=false; fi
  /usr/bin/time -v env PYTHONPATH="$src" "$PY" -m tunelab.cli train --config "$cfg" max_steps="${STEPS:-6}" max_minutes=0 \
    "$sched" precision=fp32 compile=false save_steps=0 output_dir=runs/grpo-eq-$side > runs/grpo-eq-$side.log 2>&1
done
"$PY" - <<'PYEOF'
import json
old, new = ([json.loads(l) for l in open(f"runs/grpo-eq-{s}/metrics.jsonl") if '"loss"' in l] for s in ("old", "new"))
for a, b in zip(old, new):
    same = all(a[k] == b[k] for k in ("reward", "completions/mean_length", "kl"))
    print(a["step"], f'{a["loss"]:.10f} {b["loss"]:.10f} diff {abs(a["loss"] - b["loss"]):.1e}', "same completions" if same else "DIFFER")
PYEOF
