"""Where the CPU slot attention's explicit products stop beating SDPA's flash kernel (runtime.slot_products):
forward + backward milliseconds of both over the same tokens, per head width, slot length and precision.
Every call holds --tokens tokens (tokens // length causal slots) of HEADS query heads and KV_HEADS KV heads.

    PYTHONPATH=src flock /tmp/tunelab-cpu.lock python benchmarks/scripts/attention_crossover.py --dtype bf16
    env ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 ... --dtype fp32
Prints one JSON line per (head width, length): both times and slots' time over flash's.
"""

import argparse
import json

import torch
from prepack_matmul import median_ms  # this folder's script: the median of n calls after one
from torch.nn.attention import SDPBackend, sdpa_kernel

from tunelab.model.attention import _SlotAttention

TOKENS = 4096  # --tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--dims", default="32,64,128")
    parser.add_argument("--lengths", default="32,64,128,192,256")
    parser.add_argument("--heads", default="8:8,9:3", help="query:kv head pairs")
    parser.add_argument("--calls", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=TOKENS, help="tokens per call: tokens // length slots")
    parser.add_argument("--compile", action="store_true", help="both paths under torch.compile, as a compiled block")
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    for pair in args.heads.split(","):
        heads, kv_heads = map(int, pair.split(":"))
        for dim in map(int, args.dims.split(",")):
            for length in map(int, args.lengths.split(",")):
                slots = args.tokens // length
                opts = dict(dtype=dtype, requires_grad=True)
                q = torch.randn(slots, heads, length, dim, **opts)
                k, v = (torch.randn(slots, kv_heads, length, dim, **opts) for _ in range(2))
                grad = torch.randn(slots, heads, length, dim, dtype=dtype)

                def sdpa(q, k, v):
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        return torch.nn.functional.scaled_dot_product_attention(
                            q, k, v, is_causal=True, enable_gqa=heads != kv_heads
                        )

                def slot(q, k, v):
                    return _SlotAttention.apply(q, k, v, dim**-0.5, None)

                if args.compile:
                    torch._dynamo.reset()
                    sdpa, slot = torch.compile(sdpa, dynamic=False), torch.compile(slot, dynamic=False)

                def flash():
                    sdpa(q, k, v).backward(grad)

                def products():
                    slot(q, k, v).backward(grad)

                row = {
                    "dtype": args.dtype,
                    "compiled": args.compile,
                    "tokens": args.tokens,
                    "heads": heads,
                    "kv_heads": kv_heads,
                    "dim": dim,
                    "length": length,
                }
                row["flash_ms"] = round(median_ms(flash, args.calls), 2)
                row["slots_ms"] = round(median_ms(products, args.calls), 2)
                row["slots_over_flash"] = round(row["slots_ms"] / row["flash_ms"], 3)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
