"""Why Kahan-compensated bf16 weights lag stochastic rounding over a short run: the forward reads the bf16 weight,
which under Kahan (as under nearest rounding) moves only once the summed updates reach half a bf16 ulp of it,
while stochastic rounding moves it with probability |update| / ulp from the first step. AdamW's step is at most
about lr per step early on (m/sqrt(v) = sign(g) at step 1), so after k steps a weight whose half ulp exceeds
k * lr cannot have moved under Kahan. This prints, for the quickstart's weights (the embedded SmolLM2-135M, bf16),
the fraction of weights that cannot have moved after k steps at the given lr. One JSON line.
  PYTHONPATH=src python benchmarks/scripts/kahan_reach.py 2e-5
"""

from __future__ import annotations

import json
import sys

import torch
from safetensors.torch import load_file

from tunelab import sources


def half_ulp(w: torch.Tensor) -> torch.Tensor:
    """Half the gap to the next bf16 value above |w| (bf16 keeps 8 significant bits: ulp = 2**(exponent - 7))."""
    exponent = torch.frexp(w.float().abs())[1] - 1  # |w| = m * 2**e with m in [1, 2)
    return torch.ldexp(torch.ones_like(w, dtype=torch.float32), exponent - 8)


def main(lr: float) -> None:
    root = sources.resolve("embedded").path
    tensors = [t for f in sorted(root.glob("*.safetensors")) for t in load_file(f).values()]
    total = sum(t.numel() for t in tensors)
    row = {"lr": lr, "weights": total}
    for k in (1, 8, 16, 32, 64, 128):
        stuck = sum(int((half_ulp(t.to(torch.bfloat16)) > k * lr).sum()) for t in tensors)
        row[f"stuck_after_{k}_steps"] = round(stuck / total, 4)
    print(json.dumps(row))


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 2e-5)
