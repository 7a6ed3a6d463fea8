"""GRPO through the shared loop's engine features, side by side in one script (issue 66): on a small random Llama
(the embedded model's tokenizer, 4 layers of width 256), LoRA with grad_ckpt off and on, full fine-tuning with β 0
and β 0.04, and the LoRA run again on `--nproc 2` (DDP, gloo); on the embedded SmolLM2-135M, compile off and on.
Each run is its own `tunelab train` process (peak memory is the process's); per step: loss, reward, KL; per run:
the steady window's median step time and peak memory from summary.json. Rewards: a hash of the completion's
text (rewards that differ within each group, so the update trains) and the built-in length penalty.

    PYTHONPATH=src flock /tmp/tunelab-cpu.lock python benchmarks/scripts/grpo_engine.py OUT_DIR

Writes OUT_DIR/results.json (every run's figures) and prints one line per run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}
COMMON = [
    "objective=grpo",
    "data.template=compact",
    "seq_len=128",
    "micro_batch=2",
    "grad_accum=2",
    "log_steps=1",
    "precision=fp32",
    "grpo.num_generations=4",
    "grpo.max_completion_length=16",
    "grpo.log_completions_steps=0",
]
# A random model never writes an answer, so every group's rewards would be equal and nothing would train: a hash of
# the completion's text (as the tests' reward) gives each group rewards that differ, and the update runs.
HASH_REWARD = "def r(prompts, completions, **row):\n    return [float(sum(map(ord, c)) % 7) for c in completions]\n"
SMALL = [*COMMON, "max_steps=6", "lr=1e-3", "grpo.beta=0.04"]
RUNS = {
    "lora": [],
    "lora-grad-ckpt": ["grad_ckpt=true"],
    "full-beta0": ["method=full", "grpo.beta=0.0", "lr=1e-5"],
    "full-beta0.04": ["method=full", "lr=1e-5"],
}
EMBEDDED = [*COMMON, "model=embedded", "max_steps=5", "lr=1e-4", "grpo.beta=0.0", "micro_batch=2", "grad_accum=1"]


def small_model(folder: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tunelab import sources

    tokenizer = sources.load_tokenizer(sources.resolve("embedded"))
    torch.manual_seed(0)
    shape = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), num_key_value_heads=2, **shape))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run(name: str, out: Path, overrides: list[str], nproc: int = 1) -> dict:
    cmd = [sys.executable, "-m", "tunelab.cli", "train", "--config", str(out / "base.yaml"), "--quiet"]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    folder = out / name
    t0 = time.perf_counter()
    env = {**ENV, "OMP_NUM_THREADS": "1"} if nproc > 1 else ENV
    done = subprocess.run([*cmd, *overrides, f"output_dir={folder}"], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{name}: {done.stderr[-2000:]}")
    summary = json.loads((folder / "summary.json").read_text())
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    figures = {
        "command_s": round(wall, 1),
        "train_s": summary["train_s"],
        "step_time_median_s": summary["step_time_median_s"],
        "rate_window": summary["rate_window"],
        "peak_memory_bytes": summary["peak_memory_bytes"],
        "world_size": summary["world_size"],
        "loss": [r["loss"] for r in rows],
        "reward": [r["reward"] for r in rows],
        "kl": [r.get("kl") for r in rows],
        "step_elapsed_s": [r["elapsed_s"] for r in rows],
    }
    print(name, json.dumps({k: v for k, v in figures.items() if k not in ("kl", "step_elapsed_s")}), flush=True)
    return figures


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = out / "prompts.jsonl"
    subprocess.run(
        [sys.executable, "-m", "tunelab.cli", "data", "arithmetic", "--prompts", "--n", "64", "--out", str(data)],
        env=ENV,
        check=True,
        capture_output=True,
    )
    (out / "r.py").write_text(HASH_REWARD)
    rewards = f"{{name: '{out / 'r.py'}:r'}}, {{name: length, weight: 0.5, args: {{max_tokens: 12}}}}"
    (out / "base.yaml").write_text(f"data:\n  path: {data}\ngrpo:\n  rewards: [{rewards}]\n")
    model = small_model(out / "small-llama")
    results = {}
    for name, extra in RUNS.items():
        results[name] = run(name, out, [f"model={model}", *SMALL, *extra])
    results["lora-nproc2"] = run("lora-nproc2", out, [f"model={model}", *SMALL], nproc=2)
    for name, extra in (("embedded-eager", ["compile=false"]), ("embedded-compiled", ["compile=true"])):
        results[name] = run(name, out, [*EMBEDDED, *extra])
    (out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
