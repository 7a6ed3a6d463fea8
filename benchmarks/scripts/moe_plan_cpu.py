"""plan's step time on tunelab's own Mixture-of-Experts path on a CPU, with the probes taken beside the steps.

Per round and shape: tunelab's training step (benchmarks/scripts/moe_peers.py `--side tunelab`: random Qwen3-MoE,
hidden 256, expert width 256, 2 layers, vocab 8192, 4 rows x 256 tokens, LoRA r 16 on q/k/v/o and every expert,
`--precision auto`) in its own process on tunelab's allocator (jemalloc, as its CLI runs), then in this process, in
the same locked run, the probes plan's step model divides by: the matmul probe of the run's dtype, the copy probe
and the product-call probe (probe.product_call_s). Each row is then a `tunelab bench fit` row.

    PYTHONPATH=src python benchmarks/scripts/moe_plan_cpu.py measure --out raw.json [--rounds 2]
    env ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 PYTHONPATH=src python benchmarks/scripts/moe_plan_cpu.py measure --out raw-fp32.json
    PYTHONPATH=src python benchmarks/scripts/moe_plan_cpu.py rows raw.json raw-fp32.json --date 2026-12-08 --out benchmarks/plan-accuracy/rows/8_moe_cpu_2026-12-08.yaml
    PYTHONPATH=src python benchmarks/scripts/moe_plan_cpu.py predict --out after.json
    PYTHONPATH=<main's src> python benchmarks/scripts/moe_plan_cpu.py predict --strip --out before.json
    python benchmarks/scripts/moe_plan_cpu.py summary before.json after.json

`predict` runs `tunelab bench fit`'s fit over the rows folder and keeps every MoE row's (and twin's) measured and
predicted step; `--strip` drops the rows' `call_s` first (for code from before it). `--twins` rows: each shape's dense
twin (one expert of top_k x 256: the same active FLOPs, one product per projection), to tell plan's error on this
step without per-expert products from its error on the per-expert part (`summary`: each MoE row's step less its
twin's of the same round, measured and predicted).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "benchmarks" / "scripts"
# (experts, top_k): the two shapes of the moe-peers records and a third, held out of any choice made on the first.
SHAPES = ((64, 8, 256), (32, 4, 256), (8, 2, 256))
# `--twins`: each shape's dense twin, one expert of top_k x 256, the same active FLOPs and one product per projection:
# what plan's error is on this step without per-expert products.
TWINS = ((1, 1, 2048), (1, 1, 1024), (1, 1, 512))
LAYERS, ROWS, SEQ = 2, 4, 256


def step(experts: int, top_k: int, width: int, warmup: int, steps: int) -> dict:
    sys.path.insert(0, str(SCRIPTS))
    import moe_peers

    argv = ["--side", "tunelab", "--experts", str(experts), "--top-k", str(top_k), "--layers", str(LAYERS)]
    argv += ["--expert-width", str(width)]
    argv += ["--rows", str(ROWS), "--seq", str(SEQ), "--warmup", str(warmup), "--steps", str(steps)]
    env, allocator = moe_peers.side_env("tunelab", "own")
    out = subprocess.run(
        [sys.executable, str(SCRIPTS / "moe_peers.py"), *argv], capture_output=True, text=True, env=env, check=True
    )
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "allocator": allocator}


def probes(dtype_name: str) -> dict:
    import torch

    from tunelab import probe

    cpu = torch.device("cpu")
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    peak, n = probe.matmul_peak(dtype, cpu, fresh=True)
    return {
        "peak": peak,
        "peak_n": n,
        "bandwidth": probe.copy_bandwidth(cpu, fresh=True),
        "call_s": probe.product_call_s(dtype, cpu, fresh=True),
    }


def measure(args) -> int:
    import peft
    import torch
    import transformers

    torch.set_num_threads(2)
    runs = []
    for round_ in range(args.first_round, args.first_round + args.rounds):
        for experts, top_k, width in (SHAPES if not args.twins else ()) + (TWINS if args.twins or args.both else ()):
            ran = step(experts, top_k, width, args.warmup, args.steps)
            probed = probes(ran["precision"])
            run = {"round": round_, "experts": experts, "top_k": top_k, "expert_width": width}
            runs.append({**run, "step": ran, "probes": probed})
            print(
                f"round {round_} {experts}x{top_k}x{width} {ran['precision']}: step {ran['step_s']:.3f} s, peak "
                f"{probed['peak'] / 1e9:.0f} GFLOP/s, copy {probed['bandwidth'] / 1e9:.1f} GB/s, call "
                f"{probed['call_s'] * 1e6:.1f} us",
                file=sys.stderr,
            )
    isa = {k: os.environ[k] for k in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY") if k in os.environ}
    doc = {
        "isa_cap": isa,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__},
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


RECORD = "benchmarks/plan-accuracy/moe-plan-cpu_{}_{}.record.json"  # class, the measurement's date
CLASSES = {"bf16": "epyc-avx512bf16-2c", "fp32": "epyc-fp32-2c"}


def class_runs(paths: list[str], date: str):
    """(index, run, its record) of every run of the raw files, numbered per precision class in the order given: the
    runs as each class's record keeps them (figures.runs)."""
    seen: dict[str, int] = {}
    for path in paths:
        for run in json.loads(Path(path).read_text())["runs"]:
            precision = run["step"]["precision"]
            i = seen.get(precision, 0)
            seen[precision] = i + 1
            yield i, run, RECORD.format(CLASSES[precision], date)


def rows(args) -> int:
    import yaml

    sys.path.insert(0, str(SCRIPTS))
    import moe_peers

    from tunelab.device import cpu_vendor
    from tunelab.plan import catalog

    out = []
    for i, run, record in class_runs(args.raw, args.date):
        s, p = run["step"], run["probes"]
        bf16 = s["precision"] == "bf16"
        shape = argparse.Namespace(
            family="qwen3_moe",
            hidden=256,
            layers=LAYERS,
            heads=8,
            kv_heads=4,
            head_dim=None,
            vocab=8192,
            seq=SEQ,
            experts=run["experts"],
            top_k=run["top_k"],
            expert_width=run.get("expert_width", 256),
        )
        name = f"qwen3moe-peers-{run['experts']}x{run['top_k']}"
        if shape.expert_width != 256:
            name += f"x{shape.expert_width}"
        folder = REPO / "benchmarks" / "plan-accuracy" / "models" / name
        folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps(moe_peers.config(shape).to_diff_dict(), indent=2, sort_keys=True) + "\n"
        (folder / "config.json").write_text(text)
        out.append(
            {
                "label": f"moe-cpu {name.removeprefix('qwen3moe-peers-')} {s['precision']} round {run['round']}",
                "source": f"{record} figures.runs[{i}]",
                # the class of the machine the runs were measured on (this one), vendor included
                "device": catalog.local_class("cpu", "bf16" if bf16 else "fp32", "avx512-bf16", cpu_vendor()),
                "model": f"benchmarks/plan-accuracy/models/{name}",
                "compute_bytes": 2 if bf16 else 4,
                "measured_s": s["step_s"],
                "imbalance": round(s["router_load_max_over_mean"], 3),
                "peak": p["peak"],
                "bandwidth": p["bandwidth"],
                "call_s": p["call_s"],
            }
        )
    doc = {
        "date": args.date,
        "defaults": {
            "kind": "cpu",
            "stack": "tunelab",
            "method": "lora",
            "r": 16,
            "micro_batch": ROWS,
            "seq_len": SEQ,
            "compiled": False,
            "grad_ckpt": False,
            "packing": False,
            "lengths": f"mean:{SEQ}",
            "loss_fraction": round((SEQ - 1) / SEQ, 4),
            "fit": False,
            "note": "tunelab's MoE path on a CPU, probes beside the steps (benchmarks/scripts/moe_plan_cpu.py)",
        },
        "rows": out,
    }
    head = (
        "# tunelab's own MoE training steps on the 2-core EPYC (bf16, and fp32 under the AVX2 cap), each with the\n"
        "# matmul, copy and product-call probes taken beside it in the same locked run (benchmarks/scripts/\n"
        "# moe_plan_cpu.py). fit: false: MoE rows are predicted and shown, never fitted into the dense constants.\n"
    )
    Path(args.out).write_text(head + yaml.safe_dump(doc, sort_keys=False, width=120))
    print(f"wrote {args.out}: {len(out)} rows")
    return 0


def predict(args) -> int:
    import shutil
    import tempfile

    from tunelab.bench import fitting

    folder = Path(args.rows_dir)
    if args.strip:
        temp = Path(tempfile.mkdtemp())
        for f in folder.glob("*.yaml"):
            lines = f.read_text().splitlines(keepends=True)
            (temp / f.name).write_text("".join(x for x in lines if not x.strip().startswith("call_s:")))
        folder = temp
    os.chdir(REPO)
    result = fitting.run(folder)
    if args.strip:
        shutil.rmtree(folder)
    keep = ("label", "source", "device", "stack", "model", "imbalance", "measured_s", "predicted_s_in")
    keep += ("error_in", "predicted_s_out", "error_out", "breakdown_in", "peak", "bandwidth")
    rows = [
        {k: r.get(k) for k in keep} | {"call_s": r.get("call_s")} for r in result.rows() if "/models/" in r["model"]
    ]
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def summary(args) -> int:
    import statistics

    before = {r["label"]: r for r in json.loads(Path(args.before).read_text())}
    after = {r["label"]: r for r in json.loads(Path(args.after).read_text())}
    groups: dict[str, list] = {}
    for label, a in after.items():
        b = before.get(label, {})
        eb, ea = b.get("error_in"), a["error_in"]
        print(
            f"| {label} | {a['imbalance']:.2f} | {a['measured_s']:.3f} | {b.get('predicted_s_in', float('nan')):.3f} | "
            f"{eb if eb is None else f'{eb:+.0%}'} | {a['predicted_s_in']:.3f} | {ea:+.0%} |"
        )
        kind = "twin" if "1x1x" in label else ("tunelab" if a["stack"] == "tunelab" else "hf")
        group = f"{kind} {'fp32' if 'fp32' in label else 'bf16'}"
        groups.setdefault(group, []).append((eb, ea))
    for group, errs in groups.items():
        med_b = statistics.median(abs(e) for e, _ in errs if e is not None) if errs[0][0] is not None else None
        med_a = statistics.median(abs(e) for _, e in errs)
        print(f"{group}: {len(errs)} rows, median |error| before {med_b}, after {med_a:.3f}")
    # each MoE row's step less its twin's of the same round and precision: measured and predicted
    twin_of = {"64x8": "1x1x2048", "32x4": "1x1x1024", "8x2": "1x1x512"}
    for label, a in after.items():
        parts = label.split()
        if len(parts) < 5 or parts[0] != "moe-cpu" or parts[1] not in twin_of:
            continue
        twin = " ".join([parts[0], twin_of[parts[1]], *parts[2:]])
        if twin not in after:
            continue
        t, bt, b = after[twin], before.get(twin, {}), before.get(label, {})
        measured = a["measured_s"] - t["measured_s"]
        print(
            f"excess {label}: measured {measured:+.3f}, predicted before "
            f"{b.get('predicted_s_in', 0) - bt.get('predicted_s_in', 0):+.3f}, after "
            f"{a['predicted_s_in'] - t['predicted_s_in']:+.3f}"
        )
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    m.add_argument("--rounds", type=int, default=2)
    m.add_argument("--warmup", type=int, default=3)
    m.add_argument("--steps", type=int, default=10)
    m.add_argument("--twins", action="store_true", help="the shapes' dense twins (TWINS) instead")
    m.add_argument("--both", action="store_true", help="the shapes and then their twins, each round")
    m.add_argument("--first-round", type=int, default=1, help="the first round's number")
    r = sub.add_parser("rows")
    r.add_argument("raw", nargs="+")
    r.add_argument("--out", required=True)
    r.add_argument("--date", required=True, help="the measurement's date: its records' names and the rows' date")
    q = sub.add_parser("predict")
    q.add_argument("--rows-dir", default=str(REPO / "benchmarks" / "plan-accuracy" / "rows"))
    q.add_argument("--strip", action="store_true")
    q.add_argument("--out", required=True)
    y = sub.add_parser("summary")
    y.add_argument("before")
    y.add_argument("after")
    args = p.parse_args()
    return {"measure": measure, "rows": rows, "predict": predict, "summary": summary}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
