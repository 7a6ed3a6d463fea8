"""Rows of varied length on this CPU: plan's peak against the measured peak of short runs whose rows vary in length
and are truncated at seq_len (issue 69's varied-rows memory part).

    PYTHONPATH=src .venv/bin/python benchmarks/scripts/varied_rows.py [--out benchmarks/plan-accuracy/
        varied-rows_<device-class>_<date>]

The embedded model (SmolLM2-135M), LoRA r 8 on every linear, eager blocks, bf16, seq_len 512, micro-batch 4, one
epoch of 24 rows (6 optimizer steps, every micro-batch met). Three runs, three rounds of them, each a fresh process as `tunelab train`
(bench.points.measure_point: the peak is peak RSS above the RSS before the model loads, under jemalloc as the CLI
runs): `uniform`, every row longer than seq_len, so every micro-batch is 512 wide; `varied`, rows of 30 to ~700
tokens (a quarter truncated), unpacked: each micro-batch padded to its longest row, so widths vary from batch to
batch and the widest is seq_len; `varied-packed`, the same rows packed into rows of 512, where collate decides per
micro-batch whether attention runs in per-sequence slots. plan's figure is `plan --gpu local`'s (uncalibrated),
its model terms (the peak less the catalog's CPU runtime overhead) and with the overhead the `uniform` run
measures in their place (measured − model terms of `uniform`), which the other two are held against.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from records import write_record  # benchmarks/scripts/, the record format

REPO = Path(__file__).resolve().parents[2]
SEQ_LEN, MICRO_BATCH, ROWS = 512, 4, 24
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa")


def rows(kind: str) -> list[dict]:
    """24 instruction rows (the same every run): `uniform` all over seq_len; else one in six over it, the others
    of ~20 to ~190 tokens."""
    import random

    r = random.Random(0)
    out = []
    for k in range(ROWS):
        n = r.randint(300, 400) if kind == "uniform" or k % 6 == 0 else r.randint(8, 90)
        words = " ".join(r.choice(WORDS) for _ in range(n))
        out.append({"instruction": f"Repeat: {words}", "output": words})
    return out


CASES = (("uniform", "uniform", False), ("varied", "varied", False), ("varied-packed", "varied", True))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--repeats", type=int, default=3, help="rounds of the three runs; the median peak is reported")
    p.add_argument("--device-class", default="epyc-avx512bf16-2c", help="the file name's device token")
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))
    from tunelab import allocator

    allocator.reexec_with_jemalloc()  # as the CLI runs: the measured RSS is jemalloc's
    import numpy as np

    from tunelab.bench.points import measure_point
    from tunelab.config import load_config
    from tunelab.data.packing import slots_pay
    from tunelab.plan import memory
    from tunelab.recipes.predict import dataset_lengths, local_prediction
    from tunelab.sources import resolve_arch

    folder = Path(tempfile.mkdtemp(prefix="varied-rows-"))
    results, configs = [], []
    for name, kind, packing in CASES:
        data = folder / f"{kind}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows(kind)))
        cfg = load_config(
            None,
            [
                "model=embedded",
                f"data.path={data}",
                f"output_dir={folder / name}",
                f"seq_len={SEQ_LEN}",
                f"micro_batch={MICRO_BATCH}",
                "grad_accum=1",
                "epochs=1",
                "lora.r=8",
                "lora.targets=all-linear",
                "precision=bf16",
                f"packing={'true' if packing else 'false'}",
                "compile=false",
                "log_steps=1",
            ],
        )
        e = local_prediction(cfg, calibrated=False)
        lengths = dataset_lengths(cfg, None)
        arr = np.minimum(lengths.lengths, SEQ_LEN)
        w = e.work.epoch
        # Before this record's fixes plan counted no mask for whole rows (memory.Layout.row_mask), and asked once
        # whether slots pay, for the run's most sequences at its longest.
        old = replace(e.layout, row_mask=0)
        if packing and not slots_pay(w.slots or _most(lengths, e.job.run.seed), int(arr.max()), MICRO_BATCH, SEQ_LEN):
            old = replace(old, slots=0, slot_len=0, attention_probs=False)
        before = memory.breakdown(resolve_arch(cfg.model), e.job, old)
        steps = w.micro_batches  # grad_accum 1: the whole epoch
        configs.append((cfg, steps))
        results.append(
            {
                "case": name,
                "packing": packing,
                "tokens": {"min": int(arr.min()), "max": int(lengths.lengths.max()), "mean": float(arr.mean())},
                "truncated": lengths.truncated,
                "steps": steps,
                "widest_row": w.widest_row,
                "mean_width": w.tokens_padded / max(1, w.rows),
                "slots": w.slots,
                "slot_len": w.slot_len,
                "plan_peak_bytes": e.memory.total,
                "plan_overhead_bytes": e.memory.runtime_overhead,
                "plan_activations_bytes": e.memory.activations,
                "plan_model_bytes": e.memory.total - e.memory.runtime_overhead,
                "plan_model_bytes_before_fix": before.total - before.runtime_overhead,
                "plan_activations_bytes_before_fix": before.activations,
            }
        )
    # Rounds of the three runs, interleaved: one process's peak RSS moves by tens of MB from run to run.
    for _ in range(args.repeats):
        for r, (cfg, steps) in zip(results, configs):
            r.setdefault("measured_peak_bytes_runs", []).append(
                measure_point(cfg, stop_at=steps, warmup=1)["peak_memory_bytes"]
            )
            print(r["case"], r["measured_peak_bytes_runs"][-1], flush=True)
    for r in results:
        r["measured_peak_bytes"] = int(statistics.median(r["measured_peak_bytes_runs"]))
        print(json.dumps(r), flush=True)
    overhead = results[0]["measured_peak_bytes"] - results[0]["plan_model_bytes"]
    for r in results:
        r["plan_with_uniform_overhead_bytes"] = r["plan_model_bytes"] + overhead
        r["plan_with_uniform_overhead_bytes_before_fix"] = r["plan_model_bytes_before_fix"] + overhead
    cls = args.device_class
    out = args.out or REPO / "benchmarks/plan-accuracy" / f"varied-rows_{cls}_{time.strftime('%Y-%m-%d')}"
    doc = write_record(
        out,
        "python benchmarks/scripts/varied_rows.py",
        {
            "model": "embedded",
            "seq_len": SEQ_LEN,
            "micro_batch": MICRO_BATCH,
            "rows": ROWS,
            "lora.r": 8,
            "lora.targets": "all-linear",
            "precision": "bf16",
            "compile": False,
        },
        cls,
        {"runs": results, "overhead_measured_on_uniform_bytes": overhead},
    )
    print(json.dumps(doc["figures"], indent=1))
    return 0


def _most(lengths, seed: int) -> int:
    """The run's most sequences in one micro-batch (train/batches.Schedule's slot count)."""
    import numpy as np

    from tunelab.data.packing import epoch_micro_batches

    arr = np.minimum(lengths.lengths, SEQ_LEN)
    batches = epoch_micro_batches(arr, SEQ_LEN, MICRO_BATCH, True, np.random.default_rng([seed, 0]))
    return max(sum(len(row) for row in batch) for batch in batches)


if __name__ == "__main__":
    raise SystemExit(main())
