"""tunelab eval side by side: torch's product (prepack off) against the reordered weights, alternating processes."""
import sys, subprocess, time
cmd = ["-m", "tunelab.cli", "eval", "--model", "runs/quickstart/merged", "--format", "alpaca", "--template", "compact",
       "--data", "runs/quickstart/data/test.jsonl", "--limit", "200", "--max-new-tokens", "48", "--json"]
off = "import sys, runpy; from tunelab.model import prepack; prepack.applies = lambda m, r: False; sys.argv = ['tunelab'] + sys.argv[1:]; runpy.run_module('tunelab.cli', run_name='__main__')"
for i in range(2):
    for arm in ("torch", "reordered"):
        args = [sys.executable, "-c", off] + cmd[2:] if arm == "torch" else [sys.executable] + cmd
        t = time.perf_counter()
        out = subprocess.run(args, capture_output=True, text=True)
        dt = time.perf_counter() - t
        last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-300:]
        print(arm, i, f"{dt:.1f} s", last[:160], flush=True)
