"""Activation checkpointing variants on this CPU: the bytes tunelab's own model saves for backward in one forward
(none, full, selective one layer in N), beside plan's memory.checkpointed_bytes for the same config.

    PYTHONPATH=src .venv/bin/python benchmarks/scripts/checkpoint_variants.py [--out benchmarks/plan-accuracy/
        checkpoint-variants_<device-class>_<date>]

The embedded model (SmolLM2-135M, 30 layers), LoRA r 8 on every linear, eager blocks, bf16 autocast, packed rows
of 256, micro-batch 2. The selective variant checkpoints decoder layer k (counted from 1) when k % N = 0, as
torchtune's `ac_option: N`: the model is built with every layer checkpointed (`grad_ckpt: true`) and the others
given back their own class. Saved bytes: the storages autograd saved that are alive at the end of the forward
(parameters left out, each once), as tests/unit/plan/test_plan_memory_saved.py counts them; plan's figure is
activation_bytes before any layer is recomputed (recomputed=False), so the two count the same moment.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from records import write_record  # benchmarks/scripts/, the record format

REPO = Path(__file__).resolve().parents[2]
VARIANTS = (
    ("none", 0),
    ("full", 1),
    ("selective, one in 2", 2),
    ("selective, one in 3", 3),
    ("selective, one in 10", 10),
)


def rows() -> list[dict]:
    """Varied instruction rows (the same every run)."""
    import random

    r = random.Random(0)
    out = []
    for _ in range(64):
        words = " ".join(r.choice(("alpha", "beta", "gamma", "delta", "epsilon")) for _ in range(r.randint(8, 120)))
        out.append({"instruction": f"Repeat: {words}", "output": words})
    return out


def saved_bytes(cfg, every: int) -> int:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from tunelab import memwatch
    from tunelab.recipes import finetune as command
    from tunelab.train.loss import CausalLMLoss

    prep = command.prepare_run(cfg)
    AcceleratorState._reset_state()
    Accelerator(mixed_precision="bf16", cpu=True)
    model = command.build_model(cfg, prep)
    if every > 1:  # selective: give the layers not checkpointed their own class back
        for k, layer in enumerate(model.get_decoder().layers, start=1):
            if k % every:
                layer.__class__ = type(layer).__mro__[1]
    wrapped = CausalLMLoss(model)
    wrapped.train()
    return memwatch.saved_forward_bytes(wrapped, prep.schedule.step_batches(0)[0])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path)
    p.add_argument(
        "--device-class", default="epyc-avx512bf16-2c", help="the file name's device token (benchmarks/README)"
    )
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))
    from tunelab.config import load_config
    from tunelab.plan import memory
    from tunelab.plan.estimate import Job, estimate
    from tunelab.plan.job import Parts
    from tunelab.recipes.predict import dataset_lengths, local_device
    from tunelab.sources import resolve_arch

    folder = Path(tempfile.mkdtemp(prefix="ckpt-variants-"))
    data = folder / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    results = []
    for name, every in VARIANTS:
        cfg = load_config(
            None,
            [
                "model=embedded",
                f"data.path={data}",
                f"output_dir={folder / 'run'}",
                "seq_len=256",
                "micro_batch=2",
                "lora.r=8",
                "lora.targets=all-linear",
                "precision=bf16",
                "packing=true",
                "compile=false",
                f"grad_ckpt={'true' if every else 'false'}",
            ],
        )
        e = estimate(resolve_arch(cfg.model), dataset_lengths(cfg, None), Job.of(cfg), local_device("bf16"))
        job = replace(e.job, parts=Parts(ckpt_every=max(every, 1)))
        predicted = memory.activation_bytes(resolve_arch(cfg.model), job, e.layout, recomputed=False)
        measured = saved_bytes(cfg, every)
        results.append({"variant": name, "every": every, "measured_bytes": measured, "predicted_bytes": predicted})
        print(
            f"{name}: saved {measured / 2**20:.2f} MiB, plan {predicted / 2**20:.2f} MiB, {predicted / measured - 1:+.1%}"
        )
    cls = args.device_class
    out = args.out or REPO / "benchmarks/plan-accuracy" / f"checkpoint-variants_{cls}_{time.strftime('%Y-%m-%d')}"
    doc = write_record(
        out,
        "python benchmarks/scripts/checkpoint_variants.py",
        {
            "model": "embedded",
            "seq_len": 256,
            "micro_batch": 2,
            "lora.r": 8,
            "lora.targets": "all-linear",
            "precision": "bf16",
            "packing": True,
            "compile": False,
        },
        cls,
        {"variants": results},
    )
    lines = [
        f"# Activation checkpointing variants: saved bytes against plan ({doc['date']})",
        "",
        "Command: `python benchmarks/scripts/checkpoint_variants.py` (under the CPU lock). "
        + __doc__.split("\n\n", 2)[2].replace("\n", " ").strip(),
        "",
        f"Versions: {', '.join(f'{k} {v}' for k, v in doc['versions'].items())}.",
        "",
        "| variant | layers checkpointed | saved MiB (measured) | plan MiB | plan vs measured |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results:
        n = 30 // r["every"] if r["every"] else 0
        lines.append(
            f"| {r['variant']} | {n} of 30 | {r['measured_bytes'] / 2**20:.2f} | {r['predicted_bytes'] / 2**20:.2f} | "
            f"{r['predicted_bytes'] / r['measured_bytes'] - 1:+.1%} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
