"""A GRPO micro-batch's attention in bf16 (the peer shape's update: 16 rows of 62 tokens, the embedded model's 9
query and 3 KV heads of 64), forward and forward + backward: SDPA's flash kernel, its math path, and the explicit
products of model/attention._SlotAttention that GRPO's rows now run (attention.rows_attention); milliseconds per
call and the output's largest difference from flash's.

    PYTHONPATH=src flock /tmp/tunelab-cpu.lock python benchmarks/scripts/grpo_update_attention.py
"""

import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from tunelab.model.attention import _SlotAttention

ROWS, HEADS, KV_HEADS, LENGTH, DIM = 16, 9, 3, 62, 64


def per_call_ms(fn, n: int = 20) -> float:
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e3


def main() -> None:
    torch.manual_seed(0)
    bf16 = dict(dtype=torch.bfloat16, requires_grad=True)
    q = torch.randn(ROWS, HEADS, LENGTH, DIM, **bf16)
    k, v = (torch.randn(ROWS, KV_HEADS, LENGTH, DIM, **bf16) for _ in range(2))
    grad = torch.randn(ROWS, HEADS, LENGTH, DIM, dtype=torch.bfloat16)

    def sdpa(backend):
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    paths = {
        "flash": lambda: sdpa(SDPBackend.FLASH_ATTENTION),
        "math": lambda: sdpa(SDPBackend.MATH),
        "slot products": lambda: _SlotAttention.apply(q, k, v, DIM**-0.5, None),
    }
    with torch.no_grad():
        reference = paths["flash"]().float()
    for name, fn in paths.items():
        with torch.no_grad():
            diff = (fn().float() - reference).abs().max().item()
        both = per_call_ms(lambda fn=fn: fn().backward(grad))
        print(f"{name}: forward {per_call_ms(fn):.2f} ms, forward + backward {both:.2f} ms, max diff {diff:.3g}")


if __name__ == "__main__":
    main()
