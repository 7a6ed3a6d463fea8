"""fp32 products of the embedded model's weight shapes at few rows: torch's (x @ Wᵀ) against oneDNN over a weight
reordered once (model/prepack.py), milliseconds per product, median of 20 after a warm-up. Prints a markdown table.

    python benchmarks/scripts/prepack_matmul.py [--rows 1,4,8,16,64,80]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tunelab.model import prepack

# SmolLM2-135M: LM head (vocab x hidden), MLP up/gate (intermediate x hidden), down (hidden x intermediate), q/o.
SHAPES = {
    "head 49152x576": (49152, 576),
    "up 1536x576": (1536, 576),
    "down 576x1536": (576, 1536),
    "q 576x576": (576, 576),
}


def median_ms(fn, n: int = 20) -> float:
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,4,8,16,64,80")
    rows = [int(r) for r in parser.parse_args().rows.split(",")]
    print("| weight | " + " | ".join(f"{r} rows: torch / reordered ms" for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for label, shape in SHAPES.items():
        weight = torch.randn(*shape)
        packed = prepack.reorder(weight, 16)
        cells = []
        for r in rows:
            x = torch.randn(r, shape[1])
            plain = median_ms(lambda: x @ weight.T)
            ours = median_ms(lambda: prepack.linear(x, packed, None))
            cells.append(f"{plain:.2f} / {ours:.2f}")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
