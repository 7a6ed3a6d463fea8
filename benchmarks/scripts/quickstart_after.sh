# Sourced by the scripts that tune further from the quickstart's SFT adapter (quickstart_dpo.sh,
# quickstart_grpo.sh) after they set OUT: the tunelab command line, a timings file under OUT with `stamp NAME`
# writing the seconds since start, and the quickstart's adapter merged into runs/quickstart/merged once.
PY=${PYTHON:-.venv/bin/python}
TL="$PY -m tunelab.cli"
mkdir -p "$OUT"
start=$(date +%s)
stamp() { echo "$1 $(( $(date +%s) - start ))" >> "$OUT/timings.txt"; }
: > "$OUT/timings.txt"
[ -d runs/quickstart/merged ] || $TL export --adapter runs/quickstart/adapter --merge --out runs/quickstart/merged
stamp merged
