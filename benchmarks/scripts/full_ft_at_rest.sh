cd "$(git rev-parse --show-toplevel)"; OUT=${OUT:-/tmp/at-rest}  # OUT/train.jsonl: the 2,000 aligned rows of benchmarks/scripts/full_ft_live_peaks.sh
for w in fp32 bf16; do
 LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1,oversize_threshold:0 PYTHONPATH=src timeout 200 .venv/bin/python benchmarks/scripts/live_tensors.py --config configs/quickstart.yaml method=full data.path=$OUT/train.jsonl seq_len=128 micro_batch=4 max_steps=2 lr=1e-4 compile=false max_grad_norm=0 optimizer=adafactor weights=$w output_dir=$OUT/tens-$w --quiet 2>&1 | grep -A9 ALLOCATED
done
