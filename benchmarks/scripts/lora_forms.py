"""The fused LoRA layer's products in three forms, per layer shape of a catalog model, on this device.

model/lora_linear.py computes y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ as ONE GEMM, [x | xAᵀ]·[W | sB]ᵀ, so the adapter's update
and the base product meet in the GEMM's fp32 accumulator and are rounded once (an update under half a bf16 ulp
of the output survives). The price is two copies per call: x widened by r columns, and W by sB. This measures,
for each adapted layer of a model at T tokens per micro-batch:

- forward `cat` (the shipped form), `addmm` ((xAᵀ·sBᵀ).addmm_(x, Wᵀ): the update written first, then added to
  the base product in the GEMM's epilogue, no copy of x or W), `peft` (two products and an add: two
  roundings), and `floor` (x·Wᵀ alone);
- input gradient `merge` (the shipped g·(W + sB·A)), `addmm` ((g·sB·A).addmm_(g, W)) and `floor` (g·W);
- for each forward form, the share of outputs equal to the exact y rounded once to bf16, with updates of
  about a quarter of a bf16 ulp of their outputs: near 1 for a form that rounds once, lower (by the share
  of updates a second rounding moved) for one that rounds the base product first. `--compile` adds each form
  compiled with a pointwise consumer (y·2), where inductor may move an addmm's add into the consumer's kernel
  and so round twice.

    PYTHONPATH=src python benchmarks/scripts/lora_forms.py --model smollm2-135m --tokens 4096 [--compile] > out.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def layer_shapes(model: str) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of each all-linear LoRA target of a catalog model's decoder layer."""
    from tunelab.sources import resolve_arch

    a = resolve_arch(model)
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    return {
        "q": (a.hidden, q),
        "k": (a.hidden, kv),
        "v": (a.hidden, kv),
        "o": (q, a.hidden),
        "gate": (a.hidden, a.intermediate),
        "up": (a.hidden, a.intermediate),
        "down": (a.intermediate, a.hidden),
    }


FORWARD = {
    "cat": lambda x, xa, w, sb: torch.cat([x, xa], 1) @ torch.cat([w, sb], 1).T,
    "addmm": lambda x, xa, w, sb: (xa @ sb.T).addmm_(x, w.T),
    "peft": lambda x, xa, w, sb: x @ w.T + xa @ sb.T,
    "floor": lambda x, xa, w, sb: x @ w.T,
}
BACKWARD = {
    "merge": lambda g, w, sb, a: g @ torch.addmm(w, sb, a),
    "addmm": lambda g, w, sb, a: ((g @ sb) @ a).addmm_(g, w),
    "floor": lambda g, w, sb, a: g @ w,
}


def timed(fn, device: torch.device, repeats: int) -> float:
    """Best of 3 windows of `repeats` calls, in ms per call: the fastest window is the least disturbed one."""

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        fn()
    sync()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        sync()
        best = min(best, (time.perf_counter() - start) / repeats * 1e3)
    return best


def once_rounded(y: torch.Tensor, reference: torch.Tensor) -> float:
    """Share of outputs equal to the exact result rounded once."""
    return (y == reference).float().mean().item()


def measure(d_in: int, d_out: int, tokens: int, rank: int, device, dtype, repeats: int, compile_: bool) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device, dtype)

    x, w, a = rand(tokens, d_in), rand(d_out, d_in, scale=d_in**-0.5), rand(rank, d_in, scale=d_in**-0.5)
    xa = x @ a.T
    base = x.float() @ w.float().T
    # sB scaled so that every update is about a quarter of a bf16 ulp of its output (2^-8 relative / 4).
    raw = xa.float() @ rand(d_out, rank).float().T
    sb = (rand(d_out, rank).float() * (base.abs().mean() / raw.abs().mean() * 2**-10)).to(dtype)
    g = rand(tokens, d_out)
    reference = (base + xa.float() @ sb.float().T).to(dtype)
    out = {"d_in": d_in, "d_out": d_out, "forward_ms": {}, "backward_ms": {}, "once_rounded": {}}
    for name, form in FORWARD.items():
        out["forward_ms"][name] = round(timed(lambda: form(x, xa, w, sb), device, repeats), 4)
        out["once_rounded"][name] = round(once_rounded(form(x, xa, w, sb), reference), 4)
        if compile_ and name != "floor":
            compiled = torch.compile(lambda x, xa, w, sb, form=form: form(x, xa, w, sb) * 2)
            out["once_rounded"][f"{name}-compiled"] = round(once_rounded(compiled(x, xa, w, sb), reference * 2), 4)
    for name, form in BACKWARD.items():
        out["backward_ms"][name] = round(timed(lambda: form(g, w, sb, a), device, repeats), 4)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help="catalog id whose layer shapes to measure")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per micro-batch (micro_batch x seq_len)")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--compile", action="store_true", help="also check each form compiled, for its rounding")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    layers = {
        name: measure(d_in, d_out, args.tokens, args.rank, device, dtype, args.repeats, args.compile)
        for name, (d_in, d_out) in layer_shapes(args.model).items()
    }
    totals = {
        kind: {form: round(sum(layer[kind][form] for layer in layers.values()), 4) for form in forms}
        for kind, forms in (("forward_ms", FORWARD), ("backward_ms", BACKWARD))
    }
    from tunelab.device import device_name, library_versions

    print(
        json.dumps(
            {
                "model": args.model,
                "tokens": args.tokens,
                "rank": args.rank,
                "dtype": "bf16",
                "device": device_name(device),
                "versions": library_versions(),
                "layers": layers,
                "per_layer_totals": totals,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
