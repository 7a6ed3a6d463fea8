"""The slot attention's softmax correction in bf16: rowsum(P * dP) (model/attention.py) against
flash-attention's rowsum(dO * O). Prints each form's largest error against an fp32 reference next to bf16
SDPA's, and the fastest of 40 interleaved eager forward + backward passes at three slot lengths.

    python benchmarks/scripts/slot_attention_correction.py
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from tunelab.model.attention import _SlotAttention


class _FlashCorrection(_SlotAttention):
    """The same forward; backward with the correction rowsum(dO * O) from the kept output."""

    @staticmethod
    def forward(ctx, q, k, v, scale: float, window: int | None = None):
        out = _SlotAttention.forward(ctx, q, k, v, scale, window)
        kept = ctx.to_save  # what the forward above saved: q (folded onto the KV heads), k, v, probs
        ctx.save_for_backward(*kept, out.reshape(kept[0].shape))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, probs, out = ctx.saved_tensors
        grad_out = grad_out.reshape(out.shape).to(out.dtype)
        grad_v = probs.transpose(-1, -2) @ grad_out
        grad_probs = grad_out @ v.transpose(-1, -2)
        correction = (grad_out.float() * out.float()).sum(-1, keepdim=True)
        grad_scores = (probs.float() * (grad_probs.float() - correction) * ctx.scale).to(q.dtype)
        return (grad_scores @ k).view(ctx.shape), grad_scores.transpose(-1, -2) @ q, grad_v, None, None


def _run(fn, inputs, grad_out):
    for x in inputs:
        x.grad = None
    out = fn(*inputs)
    out.backward(grad_out.to(out.dtype))
    return [out.detach().float()] + [x.grad.float() for x in inputs]


def errors() -> None:
    torch.manual_seed(0)
    shapes = [(3, 6, 33, 16), (3, 2, 33, 16), (3, 2, 33, 16)]
    inputs = [torch.randn(s, dtype=torch.bfloat16, requires_grad=True) for s in shapes]
    grad_out = torch.randn(shapes[0], dtype=torch.bfloat16)

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)

    exact = _run(sdpa, [x.detach().float().requires_grad_() for x in inputs], grad_out.float())
    runs = {
        "rowsum(P*dP)": _run(lambda q, k, v: _SlotAttention.apply(q, k, v, 0.3), inputs, grad_out),
        "rowsum(dO*O)": _run(lambda q, k, v: _FlashCorrection.apply(q, k, v, 0.3), inputs, grad_out),
        "bf16 SDPA": _run(sdpa, inputs, grad_out),
    }
    print(f"torch {torch.__version__}: largest |error| against fp32 SDPA (3 slots, 6 heads / 2 KV, L 33, D 16)")
    for name, got in runs.items():
        print(
            f"  {name:13s}",
            "  ".join(
                f"{t} {float((a - r).abs().max()):.4f}" for t, a, r in zip(["out", "dq", "dk", "dv"], got, exact)
            ),
        )


def timings() -> None:
    torch.manual_seed(0)
    print("fastest of 40 interleaved eager forward + backward passes, bf16, 9 heads (SmolLM2), D 64")
    for slots, length in ((16, 64), (8, 128), (4, 256)):
        q, k, v = (torch.randn(slots, 9, length, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        g = torch.randn(slots, 9, length, 64, dtype=torch.bfloat16)
        best = {"rowsum(P*dP)": float("inf"), "rowsum(dO*O)": float("inf")}
        for _ in range(40):
            for name, fn in (("rowsum(P*dP)", _SlotAttention), ("rowsum(dO*O)", _FlashCorrection)):
                start = time.perf_counter()
                fn.apply(q, k, v, 0.125).backward(g)
                best[name] = min(best[name], time.perf_counter() - start)
        print(f"  {slots} slots of {length}: " + ", ".join(f"{n} {t * 1e3:.2f} ms" for n, t in best.items()))


if __name__ == "__main__":
    errors()
    timings()
