"""GGUF export proven in llama.cpp itself: a quickstart-style adapter exported with `tunelab export --format gguf`,
loaded by llama.cpp (the `llama-cpp-python` package, which builds llama.cpp from source), its greedy
continuations of held-out additions compared with transformers' on the same file, and the exact match of the
exported model beside the adapter's own (`tunelab eval`).

    python benchmarks/scripts/gguf_roundtrip.py --llama-python .venv-llama/bin/python [--run RUN] [--out PREFIX]

`make gguf-check` builds that interpreter once and runs this. Without --run, it trains a short adapter first:
configs/quickstart.yaml on 3,000 rows of 1-4 digit additions (held-out rows: 200 more from the same
generator, disjoint from training). llama.cpp runs in its own interpreter so that tunelab's environment stays
as `make install` makes it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REUSE = False  # --reuse: keep the exports and evaluations an earlier run of this script left in --work
QUANTS = ("bf16", "q8_0")

# Runs in the llama.cpp interpreter: each prompt's greedy continuation, at most its budget of tokens, ending at
# the model's end-of-generation token, as tunelab eval's generation ends at EOS.
LLAMA_SCRIPT = r"""
import json, sys, llama_cpp
import llama_cpp.llama_cpp as lib
# No weight repacking: the CPU backend's repacked q8_0 kernels of a native build died with SIGILL on the
# 2-core AMX Xeon VM (bf16 ran); the plain kernels read the same tensors.
default_params = lib.llama_model_default_params
def without_repacking():
    params = default_params()
    params.use_extra_bufts = False
    return params
lib.llama_model_default_params = without_repacking
model, prompts, out, threads, lora = sys.argv[1:6]
llm = llama_cpp.Llama(
    model_path=model, lora_path=lora or None, n_ctx=512, n_threads=int(threads), verbose=False, seed=0
)
rows = [json.loads(line) for line in open(prompts)]
with open(out, "w") as f:
    for row in rows:
        ids = llm.tokenize(row["prompt"].encode(), add_bos=False, special=True)
        got = []
        for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            if llama_cpp.llama_vocab_is_eog(llm._model.vocab, tok) or len(got) >= row["budget"]:
                break
            got.append(tok)
        llm.reset()
        text = llm.detokenize(got).decode("utf-8", errors="replace")
        f.write(json.dumps({"response": text, "ids": got}) + "\n")
print(llama_cpp.__version__)
"""


def tunelab(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-m", "tunelab.cli", *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"tunelab {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def train(work: Path) -> Path:
    data = work / "data"
    tunelab(
        "data", "arithmetic", "--digits", "1-4", "--n", "3000", "--response", "aligned",
        "--out", str(data / "train.jsonl"), "--test-out", str(data / "test.jsonl"), "--test-n", "200",
    )  # fmt: skip
    tunelab(
        "train", "--config", str(REPO / "configs/quickstart.yaml"), f"data.path={data / 'train.jsonl'}",
        f"output_dir={work / 'run'}", "compile=false",
    )  # fmt: skip
    return work / "run"


def evaluate(data: Path, predictions: Path, *model_args: str) -> dict:
    summary = predictions.with_suffix(".summary.json")
    if REUSE and summary.is_file() and predictions.is_file():
        return json.loads(summary.read_text())
    line = tunelab(
        "eval", "--data", str(data), "--json", "--precision", "fp32", "--predictions", str(predictions), *model_args
    )
    summary.write_text(line.strip().splitlines()[-1])
    return json.loads(summary.read_text())


def responses(path: Path) -> list[str]:
    return [json.loads(line)["response"] for line in path.open()]


def llama_cpp_run(python: str, model: Path, prompts: Path, out: Path, threads: int, lora: Path | None = None) -> str:
    args = [str(model), str(prompts), str(out), str(threads), str(lora or "")]
    done = subprocess.run([python, "-c", LLAMA_SCRIPT, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"llama.cpp run failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def prompts_file(rows: list[dict], path: Path) -> None:
    """Prompts rendered and budgeted as tunelab eval renders them (compact alpaca, the run's template)."""
    sys.path.insert(0, str(REPO / "src"))
    from tunelab.data.formats import prompt_text
    from tunelab.eval.generate import response_budgets
    from tunelab.sources import load_tokenizer, resolve

    tokenizer = load_tokenizer(resolve("embedded"))
    budgets = response_budgets(tokenizer, rows, "alpaca", "compact")
    with path.open("w") as f:
        for row, budget in zip(rows, budgets):
            f.write(json.dumps({"prompt": prompt_text("alpaca", "compact", row), "budget": budget}) + "\n")


def exact(responses_: list[str], rows: list[dict]) -> float:
    sys.path.insert(0, str(REPO / "src"))
    from tunelab.eval.exact_match import extract, parse_answer

    hits = 0
    for text, row in zip(responses_, rows):
        want = parse_answer(row["answer"])
        hits += want is not None and extract(text, len(want)) == want
    return hits / len(rows)


def versions(python: str) -> dict:
    from importlib.metadata import version

    import gguf  # noqa: F401
    import peft
    import torch
    import transformers

    llama = subprocess.run([python, "-c", "import llama_cpp; print(llama_cpp.__version__)"], capture_output=True)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return {
        "tunelab_commit": commit.stdout.strip(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "gguf": version("gguf"),
        "llama_cpp_python": llama.stdout.decode().strip(),
        "cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?"),
        "cores": len(os.sched_getaffinity(0)),
    }


def lora_check(args, run: Path, rows: list[dict], prompts: Path, adapter_responses: list[str]) -> dict:
    """The adapter alone (--format gguf-lora) applied by llama.cpp to the embedded GGUF it was trained on: that
    file is Q4_1 (tunelab trains on its dequantized weights), so this is llama.cpp's --lora path, not a match."""
    sys.path.insert(0, str(REPO / "src"))
    from tunelab.sources import embedded_gguf

    out = args.work / "gguf-lora" / "adapter.gguf"
    if out.exists():
        out.unlink()
        (out.parent / "Modelfile").unlink(missing_ok=True)
    tunelab("export", "--adapter", str(run / "adapter"), "--format", "gguf-lora", "--quant", "f16", "--out", str(out))
    responses_out = out.parent / "llama_cpp.responses.jsonl"
    llama_cpp_run(args.llama_python, embedded_gguf(), prompts, responses_out, args.threads, out)
    llama = responses(responses_out)
    return {
        "base": embedded_gguf().name,
        "file_bytes": out.stat().st_size,
        "llama_cpp_exact_match": exact(llama, rows),
        "llama_cpp_equals_adapter": sum(a == b for a, b in zip(llama, adapter_responses)) / len(rows),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama-python", default="", help="a python with llama-cpp-python installed")
    p.add_argument("--run", type=Path, help="a trained run (RUN/adapter, RUN/config.yaml); default: train one")
    p.add_argument("--data", type=Path, help="held-out rows (default: the trained run's data/test.jsonl)")
    p.add_argument("--work", type=Path, default=REPO / "runs" / "gguf-check")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, help="write PREFIX.json (default: print only)")
    p.add_argument("--reuse", action="store_true", help="reuse the exports and evaluations already in --work")
    p.add_argument("--no-llama", action="store_true", help="stop before llama.cpp (exports and evaluations only)")
    args = p.parse_args()
    global REUSE
    REUSE = args.reuse
    args.work.mkdir(parents=True, exist_ok=True)
    start = time.time()
    run = args.run or train(args.work)
    data = args.data or run.parent / "data" / "test.jsonl"
    rows = [json.loads(line) for line in data.open()]
    prompts = args.work / "prompts.jsonl"
    prompts_file(rows, prompts)
    adapter_eval = evaluate(data, args.work / "adapter.predictions.jsonl", "--adapter", str(run / "adapter"))
    adapter_responses = responses(args.work / "adapter.predictions.jsonl")
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "run": str(run),
        "data": str(data),
        "rows": len(rows),
        "adapter_exact_match": adapter_eval["accuracy"],
        "exports": {},
    }
    for quant in QUANTS:
        out = args.work / f"gguf-{quant}" / "model.gguf"
        began = time.time()
        if not (REUSE and out.exists()):
            out.unlink(missing_ok=True)
            (out.parent / "Modelfile").unlink(missing_ok=True)
            tunelab(
                "export", "--adapter", str(run / "adapter"), "--format", "gguf", "--quant", quant, "--out", str(out)
            )
        export_s = time.time() - began
        hf_pred = out.parent / "transformers.predictions.jsonl"
        hf_eval = evaluate(data, hf_pred, "--model", str(out), "--format", "alpaca", "--template", "compact")
        hf = responses(hf_pred)
        if args.no_llama:
            print(quant, "transformers exact match", hf_eval["accuracy"], "export_s", round(export_s, 1))
            continue
        llama_out = out.parent / "llama_cpp.responses.jsonl"
        began = time.time()
        llama_cpp_run(args.llama_python, out, prompts, llama_out, args.threads)
        llama_s = time.time() - began
        llama = responses(llama_out)
        result["exports"][quant] = {
            "file_bytes": out.stat().st_size,
            "export_s": round(export_s, 1),
            "transformers_exact_match": hf_eval["accuracy"],
            "llama_cpp_exact_match": exact(llama, rows),
            "llama_cpp_equals_transformers_same_file": sum(a == b for a, b in zip(llama, hf)) / len(rows),
            "llama_cpp_equals_adapter": sum(a == b for a, b in zip(llama, adapter_responses)) / len(rows),
            "transformers_equals_adapter": sum(a == b for a, b in zip(hf, adapter_responses)) / len(rows),
            "llama_cpp_s": round(llama_s, 1),
            "first_differences": [
                {"prompt": rows[i]["instruction"], "llama_cpp": llama[i], "transformers": hf[i]}
                for i in range(len(rows))
                if llama[i] != hf[i]
            ][:5],
        }
        print(quant, json.dumps({k: v for k, v in result["exports"][quant].items() if k != "first_differences"}))
    if args.no_llama:
        print("adapter exact match", adapter_eval["accuracy"])
        return 0
    result["gguf_lora"] = lora_check(args, run, rows, prompts, adapter_responses)
    result["versions"] = versions(args.llama_python)
    result["wall_s"] = round(time.time() - start, 1)
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(markdown(result))
    return 0


def markdown(result: dict) -> str:
    """The results file: command, versions, and one row per export beside the adapter."""
    v = result["versions"]
    lines = [
        "# GGUF export loaded back in llama.cpp",
        "",
        f"Command: `{result['command']}` (wall {result['wall_s']} s). Run: `{result['run']}`; held-out rows: "
        f"`{result['data']}` ({result['rows']} additions, none in training). Greedy decoding everywhere; "
        "transformers computes in fp32 (`tunelab eval --precision fp32`).",
        "",
        "Versions: " + ", ".join(f"{k} {v[k]}" for k in v),
        "",
        f"The adapter itself (`tunelab eval --adapter`): exact match {result['adapter_exact_match']:.1%}.",
        "",
        "| export | file | exact match, llama.cpp | exact match, transformers (`gguf_file=`) "
        "| llama.cpp = transformers, same file | llama.cpp = adapter | transformers = adapter |",
        "|---|---|---|---|---|---|---|",
    ]
    for quant, e in result["exports"].items():
        lines.append(
            f"| `--format gguf --quant {quant}` | {e['file_bytes'] / 2**20:.1f} MiB | {e['llama_cpp_exact_match']:.1%} "
            f"| {e['transformers_exact_match']:.1%} | {e['llama_cpp_equals_transformers_same_file']:.1%} "
            f"| {e['llama_cpp_equals_adapter']:.1%} | {e['transformers_equals_adapter']:.1%} |"
        )
    lora = result.get("gguf_lora")
    if lora:
        lines += [
            "",
            f"`--format gguf-lora` applied by llama.cpp (`lora_path`) to the embedded `{lora['base']}` (Q4_1, the "
            f"file tunelab dequantizes and trains on): exact match {lora['llama_cpp_exact_match']:.1%}, responses "
            f"equal to the adapter's {lora['llama_cpp_equals_adapter']:.1%}.",
        ]
    lines += ["", "Rows where llama.cpp and transformers differ on the same file, first five per export:", ""]
    for quant, e in result["exports"].items():
        for d in e["first_differences"]:
            lines.append(
                f"- {quant}: {d['prompt']!r}: llama.cpp {d['llama_cpp']!r}, transformers {d['transformers']!r}"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
