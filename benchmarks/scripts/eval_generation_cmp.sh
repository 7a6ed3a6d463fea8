#!/bin/bash
cd /tmp/grpo-evalcmp
for round in 1 2; do
for side in old new; do
  src=/tmp/grpo-old/src; [ $side = new ] && src=/work/wt-grpo/src
  PYTHONPATH=$src /work/main/.venv/bin/python -m tunelab eval --model embedded --format alpaca --template compact --data test.jsonl --max-new-tokens 32 --json --out e2-$side-$round.json --predictions p2-$side-$round.jsonl > /dev/null 2>&1
  python3 -c "import json;d=json.load(open('e2-$side-$round.json'));print('$side',$round,d['seconds'],d['accuracy'],d.get('capped'))"
done
done
cmp <(python3 -c "import json;[print(json.loads(l)['response']) for l in open('p2-old-1.jsonl')]") <(python3 -c "import json;[print(json.loads(l)['response']) for l in open('p2-new-1.jsonl')]") && echo "responses identical"
