"""A lent GPU's ceilings and plan's prediction for it before any of its training rows are in the fit.

    python benchmarks/scripts/gpu_ceilings.py --out FILE.json [--dry-run]

Measures the MAMF sweep (probe.measure_mamf, after stas00/ml-engineering's mamf-finder.py) and the copy bandwidth
of this GPU, prints them beside the catalog row's datasheet peak and published MAMF, then plans the rows that
benchmarks/gpu.sh measures later in the same session (the 1B and 8B LoRA shapes, compiled, seq 2048 packed) on the
matched catalog row: plan's constants for this GPU as they stand before its rows are fitted (measured, or scaled
from the measured GPUs to its ceilings). `--dry-run`: this machine's CPU, fp32, two tiny shapes, the H100's row.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

# The rows of bench/suites.yaml's `h100` and `h100-8b` suites that gpu.sh's speed steps measure afterwards, at
# their micro_batch_cap (what `micro_batch: auto` resolves to on an 80 GB part).
ROWS = {
    "1b-lora-compiled": {"model": "meta-llama/Llama-3.2-1B", "micro_batch": 8},
    "8b-lora-compiled": {"model": "meta-llama/Llama-3.1-8B", "micro_batch": 4},
}
SHARED = {
    "method": "lora",
    "seq_len": 2048,
    "packing": True,
    "grad_accum": 1,
    "lora.r": 16,
    "lora.dropout": 0.0,
    "compile": True,
}


def main(argv: list[str] | None = None) -> int:
    import torch

    from tunelab import api, probe
    from tunelab.plan import catalog

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    dev = torch.device("cpu" if args.dry_run else "cuda")
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    shapes = [(256, 256, 256), (512, 256, 512)] if args.dry_run else None
    t0 = time.perf_counter()
    flops, shape = probe.measure_mamf(dtype, dev, shapes=shapes)
    copy = probe.measure_copy_bandwidth(dev, mib=64 if args.dry_run else 1024)
    if args.dry_run:
        name, row = "dry run (CPU)", catalog.gpu("h100-sxm")
    else:
        props = torch.cuda.get_device_properties(dev)
        name, row = props.name, catalog.match_gpu(props.name, props.total_memory)
    doc = {
        "device": name,
        "catalog_id": row.id if row else None,
        "mamf_flops": flops,
        "mamf_shape": list(shape),
        "probe_s": time.perf_counter() - t0,
        "copy_bps": copy,
        "datasheet_flops": row.peak_flops if row else None,
        "published_mamf_flops": catalog.ceilings(row.id).mamf_flops if row else None,
        "catalog_bandwidth_bps": row.bandwidth_gbs * 1e9 if row else None,
        "plans": {},
    }
    for label, settings in ROWS.items() if row else ():
        (r,) = api.estimate(None, gpu=row.id, examples=2000, **SHARED, **settings)
        e = r.single
        doc["plans"][label] = {
            "tokens_per_s": e.speed.tokens_per_s,
            "step_s": e.step.total,
            "peak_memory_gib": e.memory.total / 2**30,
            "constants": e.constants.label if e.constants else "",
        }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
