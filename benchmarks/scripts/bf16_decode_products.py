"""bf16 products of a decode step's shapes on the embedded SmolLM2-135M (a LoRA r 16 layer's [x | xAᵀ]·[W | sB]ᵀ:
d_in + 16 columns; the LM head), torch's product over the plain weight against oneDNN's over the weight reordered
once (model/prepack.py), at 16, 32 and 64 rows: microseconds per call and whether the results are bit-identical.

    PYTHONPATH=src flock /tmp/tunelab-cpu.lock python benchmarks/scripts/bf16_decode_products.py
"""

import time

import torch


def per_call_us(fn, n: int = 50) -> float:
    for _ in range(5):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    torch.manual_seed(0)
    print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads(), "threads")
    shapes = ((576, 592), (1536, 592), (576, 1552), (192, 592), (49152, 576))  # q/o, gate/up, down, k/v, LM head
    for rows in (16, 32, 64):
        for d_out, d_in in shapes:
            w, x = torch.randn(d_out, d_in).bfloat16(), torch.randn(rows, d_in).bfloat16()
            packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
            plain_us = per_call_us(lambda: x @ w.T)
            packed_us = per_call_us(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
            same = torch.equal(x @ w.T, torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
            print(f"rows {rows} {d_out}x{d_in}: plain {plain_us:.0f} us, reordered {packed_us:.0f} us, equal {same}")


if __name__ == "__main__":
    main()
