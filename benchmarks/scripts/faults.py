"""kill -9 at seeded moments of a training run, then resume: nothing lost, nothing half-written.

    python benchmarks/scripts/faults.py [--kills 20] [--seed 0] [--objective sft|grpo] [--out benchmarks/faults_<device>_<date>]

A census run (uninterrupted, instrumented) counts the run's events; each kill then picks one event at random
(seeded) and SIGKILLs the training process there:

- `step`: inside an optimizer step (after backward, before the update), via a global optimizer pre-hook;
- `rename`: just before or just after the n-th `os.replace` (atomic writes of checkpoints, metrics,
  summary and the final adapter);
- `torn`: in the middle of the n-th safetensors file write (half its bytes on disk), checkpoints and the
  final adapter alike;
- `time`: after a uniform random delay over the census run's training window, wherever that lands;
- `generate` (objective grpo): at the n-th token the sampler draws (eval/sampling.py's `pick`), in the middle of
  a generation batch.

A quarter of the kills fall in optimizer steps, a quarter in checkpoint writes, a quarter in the final save
(adapter and summary), a quarter at random times; with `--objective grpo` a fifth each, the fifth in generation.
The GRPO run samples 2 completions of 2 prompts per step from the same tiny model, rewarded by a reward file's
function (the completion's length in characters: the random model's tokens differ in length, so groups'
rewards differ) with a KL term (beta > 0, so the
reference pass runs too); a resumed run must sample what the uninterrupted one did (the sampler's RNG is in the
checkpoint), so its losses, rewards and final weights are the same.

After each kill the output dir is inspected (every visible file complete: JSON parses, safetensors load,
checkpoints match their manifests), then `resume: true` runs to the end. A kill passes when the resumed
run exits 0 with every step logged once, its losses equal to the uninterrupted run's (rel 1e-5), the same
final adapter weights, and no temp file left behind. The training run is a tiny random Llama on the
embedded tokenizer, in fp32 on CPU, so that it is deterministic and quick.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

STEPS = 12
SAVE_STEPS = 3
# Per step the values a resumed run must repeat: the loss, and where the objective samples (grpo) the mean reward
# of the sampled completions.
LOSS_ONLY, WITH_REWARD = ("loss",), ("loss", "reward")


def compared(objective: str) -> tuple[str, ...]:
    from tunelab import objectives

    return WITH_REWARD if objectives.get(objective).generates else LOSS_ONLY


# A GRPO loss can be ~0 (advantages sum to 0 over a group of equal lengths): relative differences are taken
# against at least this.
LOSS_FLOOR = 1e-3


# ---- the child: arm one kill (or count events), then run `tunelab train` in this process ----


def _child(kind: str, n: int, census: str | None, argv: list[str]) -> int:
    counts = {"step": 0, "rename": 0, "torn": 0, "generate": 0}
    events: list[dict] = []

    def hit(event: str, path: str = "") -> bool:
        counts[event] += 1
        if census:
            events.append({"event": event, "n": counts[event], "phase": _phase(event, path), "t": time.time()})
            Path(census).write_text(json.dumps(events))
        return not census and event == kind.split("-")[0] and counts[event] == n

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    import torch.optim.optimizer as optim_mod

    def step_hook(optimizer, args, kwargs):
        if hit("step"):
            die()

    optim_mod.register_optimizer_step_pre_hook(step_hook)

    _arm_generate(hit, die)

    real_replace = os.replace

    def replace(src, dst, *a, **k):
        armed = hit("rename", str(dst))
        if armed and kind == "rename-before":
            die()
        real_replace(src, dst, *a, **k)
        if armed:
            die()

    os.replace = replace

    import safetensors.torch as st

    real_save_file = st.save_file

    def save_file(tensors, filename, *a, **k):
        real_save_file(tensors, filename, *a, **k)
        if hit("torn", str(filename)):
            size = os.path.getsize(filename)
            with open(filename, "r+b") as f:
                f.truncate(size // 2)
            die()

    st.save_file = save_file
    # Loaded now so that their own bindings of save_file can be patched below.
    import peft  # noqa: F401
    import transformers.modeling_utils  # noqa: F401

    for module in list(sys.modules.values()):
        # The module's own namespace: getattr on transformers' lazy modules imports what they name (and fails
        # where a model's optional dependency, torchvision say, is absent).
        names = getattr(module, "__dict__", {})
        if names.get("save_file") is real_save_file:
            module.save_file = save_file
        if names.get("safe_save_file") is real_save_file:
            module.safe_save_file = save_file
    import tunelab.train.checkpoint as ckpt

    ckpt.save_file = save_file

    from tunelab.cli import main

    return main(argv)


def _arm_generate(hit, die) -> None:
    """The `generate` event: every token the sampler draws (eval/sampling.py's pick, looked up at each token)."""
    import tunelab.eval.sampling as sampling

    real_pick = sampling.pick

    def pick(*a, **k):
        if hit("generate"):
            die()
        return real_pick(*a, **k)

    sampling.pick = pick


def _phase(event: str, path: str) -> str:
    if event in ("step", "generate"):
        return event
    if "checkpoints" in path:
        return "checkpoint"
    return "final" if ("adapter" in path or "summary" in path) else "setup"


# ---- the harness ----


def make_run(root: Path, objective: str = "sft") -> Path:
    """A tiny random Llama (the embedded tokenizer), 256 addition rows (prompt rows with answers for grpo) and a
    config; returns the config path."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from tunelab.sources import embedded_tokenizer_dir

    model_dir = root / "model"
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    r = random.Random(0)
    from tunelab import objectives

    generates = objectives.get(objective).generates  # prompt rows with answers, sampled completions
    rows = []
    answer = "answer" if generates else "output"
    for _ in range(256):
        a, b = r.randint(0, 999), r.randint(0, 999)
        rows.append({"instruction": f"{a} + {b}", answer: f"{a + b}"})
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(x) + "\n" for x in rows))
    cfg = root / "run.yaml"
    cfg.write_text(
        f"model: {model_dir}\ndata:\n  path: {data}\n  template: compact\nmethod: lora\nseq_len: 64\n"
        f"micro_batch: {2 if generates else 4}\ngrad_accum: 1\nmax_steps: {STEPS}\n"
        f"save_steps: {SAVE_STEPS}\nsave_total_limit: 2\nlog_steps: 1\nlr: 1.0e-2\nprecision: fp32\ndevice: cpu\n"
        f"seed: 0\nobjective: {objective}\n" + (sampling_section(root) if generates else "")
    )
    return cfg


def sampling_section(root: Path) -> str:
    """objective grpo's keys: G 2, 6 tokens per completion, a KL term, a reward file's function."""
    reward = root / "reward.py"
    reward.write_text("def chars(prompts, completions, **rows):\n    return [len(c) / 32 for c in completions]\n")
    return (
        "grpo:\n  num_generations: 2\n  max_completion_length: 6\n  beta: 0.04\n"
        f"  log_completions_steps: 0\n  rewards:\n    - name: {reward}:chars\n"
    )


def train(cfg: Path, out: Path, *extra: str, kind: str = "none", n: int = 0, census: Path | None = None, delay=None):
    """`tunelab train` in a process of its own, armed with one kill; returns its exit code (-9 when killed).

    The process forks from a server that imported the training stack once (multiprocessing's forkserver, as
    bench's CPU points do): a fresh interpreter importing torch, transformers and peft again for every run was
    most of each run's time. Every run forks from the same server, so all share one hash seed."""
    argv = ["train", "--config", str(cfg), f"output_dir={out}", "--quiet", *extra]
    errors = out.parent / f"{out.name}.stderr"
    out.parent.mkdir(parents=True, exist_ok=True)
    # This file by path (the tests load it without a package): the child runs it and calls _run_child.
    # The environment of now (the server's is that of its start, perhaps another caller's).
    code = f"import runpy; runpy.run_path({__file__!r})['_run_child']({kind!r}, {n}, {str(census or '')!r}, {argv!r}, {str(errors)!r}, ENVIRON)"
    proc = server().Process(target=exec, args=(code, {"__name__": "faults_child", "ENVIRON": dict(os.environ)}))
    proc.start()
    proc.join(timeout=delay)
    if proc.is_alive():
        proc.kill()
        proc.join()
    rc = proc.exitcode
    proc.close()
    err = errors.read_text() if errors.exists() else ""
    errors.unlink(missing_ok=True)
    if rc not in (0, -signal.SIGKILL):
        raise RuntimeError(f"training exited {rc}: {err.strip()[-2000:]}")
    return rc


def server():
    """The fork server the runs start from (bench's, tunelab.bench.points.fork_server), running and done
    importing: its first start imports the stack, which must not fall inside a timed run."""
    from tunelab.bench.points import fork_server

    context = fork_server()
    ready = context.Process(target=int)
    ready.start()
    ready.join()
    ready.close()
    return context


def _run_child(kind: str, n: int, census: str, argv: list[str], errors: str, environ: dict) -> None:
    """In the forked process: the caller's environment, its output to /dev/null and its errors to a file the
    harness reads, then the run."""
    os.environ.clear()
    os.environ.update(environ)
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, target, flags in ((1, os.devnull, os.O_WRONLY), (2, errors, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(target, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.exit(_child(kind, n, census or None, argv))


def losses(out: Path, keys: tuple[str, ...] = ("loss",)) -> dict[tuple[int, str], float]:
    """(step, key) -> the logged value of each of `keys` (compared()'s), each step logged once."""
    steps: dict[tuple[int, str], float] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if (rec["step"], keys[0]) in steps:
            raise AssertionError(f"step {rec['step']} logged twice")
        steps.update({(rec["step"], k): rec[k] for k in keys})
    return steps


def rel_diff(got: float, want: float) -> float:
    return abs(got - want) / max(abs(want), LOSS_FLOOR)


def half_written(out: Path) -> list[str]:
    """Visible files of `out` that are not complete; temp entries (`.tmp-*`, `.*.tmp`) are listed apart."""
    from safetensors.torch import load_file

    from tunelab.train import checkpoint

    bad = []
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out)
        if any(p.startswith(".tmp") or p.endswith(".tmp") for p in rel.parts):
            continue
        if path.is_dir() and path.name.startswith(checkpoint.PREFIX):
            if (why := checkpoint.verify(path)) is not None:
                bad.append(f"{rel}: {why}")
            continue
        if not path.is_file() or path.name == ".tunelab.lock":
            continue
        try:
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix == ".jsonl":
                for line in path.read_text().splitlines():
                    json.loads(line)
            elif path.suffix == ".safetensors":
                load_file(path)
            elif path.suffix == ".yaml":
                import yaml

                yaml.safe_load(path.read_text())
        except Exception as e:  # any failure to read it back is what this looks for
            bad.append(f"{rel}: {type(e).__name__}: {str(e)[:80]}")
    return bad


def temp_entries(out: Path) -> list[str]:
    return sorted(
        str(p.relative_to(out)) for p in out.rglob("*") if p.name.startswith(".tmp") or p.name.endswith(".tmp")
    )


def adapter_weights(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(out / "adapter" / "adapter_model.safetensors")


def moments(events: list[dict], start: float, kills: int, seed: int) -> list[tuple[str, int, float | None, str]]:
    """`kills` seeded (kind, n, delay, phase) picks, a quarter each in optimizer steps, checkpoint writes, the
    final save, and at a random time over the training window (first step to last write) of the census run; a
    fifth each, the fifth in generation, when the run generates."""
    r = random.Random(seed)
    phases = ("step", "generate", "checkpoint", "final") if any(e["phase"] == "generate" for e in events) else None
    phases = phases or ("step", "checkpoint", "final")
    by_phase = {p: [e for e in events if e["phase"] == p] for p in phases}
    window = (min(e["t"] for e in by_phase["step"]) - start, max(e["t"] for e in events) - start)
    # Each phase's events in a seeded order, taken in turn: no event is picked twice before all are picked.
    order = {p: r.sample(events, len(events)) for p, events in by_phase.items()}
    picks = []
    cycle = (*phases, "time")
    for i in range(kills):
        phase = cycle[i % len(cycle)]
        if phase == "time":
            picks.append(("time", 0, r.uniform(*window), phase))
            continue
        e = order[phase][(i // len(cycle)) % len(order[phase])]
        kind = e["event"] if e["event"] != "rename" else r.choice(("rename-before", "rename-after"))
        picks.append((kind, e["n"], None, phase))
    return picks


def run_kill(
    cfg: Path, root: Path, reference: dict, ref_weights: dict, kind: str, n: int, delay, phase, keys=("loss",)
) -> dict:
    import torch

    out = root / f"kill-{kind}-{n}-{0 if delay is None else int(delay * 1000)}"
    shutil.rmtree(out, ignore_errors=True)
    rc = train(cfg, out, kind=kind, n=n, delay=delay)
    after_kill = half_written(out) if out.exists() else []
    checkpoints = sorted(p.name for p in (out / "checkpoints").glob("step-*")) if out.exists() else []
    rc_resume = train(cfg, out, "resume=true")
    got = losses(out, keys)
    steps_ok = sorted({s for s, _ in got}) == list(range(1, STEPS + 1))
    worst = max((rel_diff(got[s], reference[s]) for s in reference if s in got), default=float("inf"))
    weights = adapter_weights(out)
    same_weights = weights.keys() == ref_weights.keys() and all(
        torch.allclose(weights[k], ref_weights[k], rtol=1e-5, atol=1e-7) for k in weights
    )
    leftovers = temp_entries(out)
    ok = rc_resume == 0 and steps_ok and worst <= 1e-5 and same_weights and not after_kill and not leftovers
    return {
        "phase": phase,
        "kind": kind,
        "event": n,
        "delay_s": delay,
        "killed": rc == -signal.SIGKILL,
        "checkpoints_at_kill": checkpoints,
        "half_written_after_kill": after_kill,
        "resume_exit": rc_resume,
        "steps_logged_once": steps_ok,
        "max_rel_loss_diff": worst,
        "same_final_weights": same_weights,
        "temp_left": leftovers,
        "ok": ok,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=Path("build/faults"))
    p.add_argument("--out", type=Path, help="write <out>.json and <out>.md")
    p.add_argument("--objective", default="sft", help="the run killed: sft (default) or grpo")
    args = p.parse_args(argv)
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    cfg = make_run(args.work, args.objective)
    keys = compared(args.objective)
    ref = args.work / "reference"
    census_file = args.work / "census.json"
    server()
    start = time.time()
    assert train(cfg, ref, census=census_file) == 0
    wall = time.time() - start
    events = json.loads(census_file.read_text())
    census = {k: sum(e["event"] == k for e in events) for k in ("step", "rename", "torn", "generate")}
    census["final_save_events"] = sum(e["phase"] == "final" for e in events)
    reference, ref_weights = losses(ref, keys), adapter_weights(ref)
    results = []
    for kind, n, delay, phase in moments(events, start, args.kills, args.seed):
        res = run_kill(cfg, args.work, reference, ref_weights, kind, n, delay, phase, keys)
        results.append(res)
        print(json.dumps(res), flush=True)
    passed = sum(r["ok"] for r in results)
    print(f"{passed}/{len(results)} kills resumed to the uninterrupted run's losses and weights", flush=True)
    if args.out:
        write_results(args.out, census, wall, results, args.objective)
    return 0 if passed == len(results) else 1


def write_results(out: Path, census: dict, wall: float, results: list[dict], objective: str = "sft") -> None:
    import platform

    import torch

    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "command": "python benchmarks/scripts/faults.py " + " ".join(sys.argv[1:]),
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "run": f"tiny random Llama (2 layers, hidden 64), LoRA, objective {objective}, fp32 CPU, {STEPS} steps, "
        f"checkpoint every {SAVE_STEPS}; compared per step: {', '.join(compared(objective))}",
        "census": census,
        "census_wall_s": round(wall, 1),
    }
    out.with_suffix(".json").write_text(json.dumps({**meta, "results": results}, indent=1) + "\n")
    lines = [
        "# kill -9 at seeded moments, then resume",
        "",
        f"{meta['date']}, `{meta['command']}`, {meta['machine']} ({meta['cpu_count']} cores), torch {meta['torch']}.",
        f"Run: {meta['run']}. Census of the uninterrupted run: {census} in {meta['census_wall_s']} s.",
        "",
        "| phase | kind | event | delay s | killed | checkpoints at kill | half-written | resume | max rel diff | same weights | ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        delay = "" if r["delay_s"] is None else f"{r['delay_s']:.2f}"
        lines.append(
            f"| {r['phase']} | {r['kind']} | {r['event']} | {delay} | {r['killed']} | {', '.join(r['checkpoints_at_kill']) or '-'} "
            f"| {len(r['half_written_after_kill'])} | {r['resume_exit']} | {r['max_rel_loss_diff']:.1e} "
            f"| {r['same_final_weights']} | {r['ok']} |"
        )
    lines += ["", f"**{sum(r['ok'] for r in results)}/{len(results)}** passed."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
