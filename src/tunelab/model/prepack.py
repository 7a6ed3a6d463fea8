"""Decoding over weights reordered once into oneDNN's blocked layout, on CPUs.

A decode step multiplies a few rows (one per completion) by every weight. torch's fp32 product (MKL's sgemm)
re-lays the weight out on every call when the rows are few: on an AVX-512 Xeon a 16-row step of the embedded model
ran at a third of what the same product over a weight laid out once takes, and on an AVX2-only Zen 3 the LM head's
product took 2.7-3.1x as long at 8-16 rows (benchmarks/design-decisions_cpu_2026-11-28.md#prepacked-decode-weights,
benchmarks/design-decisions_cpu_2026-11-29.md#prepacked-decode-weights-on-avx2). torch's bf16 product (oneDNN over
the plain weight) does too: on the AVX-512 BF16 EPYC the reordered one took 0.56-0.84x its time at 16-32 rows on
the embedded model's shapes, with bit-identical results
(benchmarks/grpo/grpo-bf16-peer_epyc-avx512bf16-2c_2026-12-07.md). `prepacked` reorders each linear layer's weight
once for the length of a generation (a fused LoRA layer's W + sBA in fp32, its [W | sB] in bf16, B as it stands
then) and restores the layers on exit. It costs one more copy of the weights while it lasts; fp32 results equal the
plain product's to fp32 rounding (the summation order differs), bf16 results were bit-identical where measured.
Applies to fp32 weights on an AVX2 or AVX-512 CPU, and to bf16 weights where oneDNN has bf16 products (AVX-512 BF16,
AMX), with oneDNN and at least `MIN_ROWS` rows.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

from ..runtime import PREPACK_CAPABILITIES, PREPACK_MIN_ROWS

# Below 8 rows the reordered product measured no faster, and at one row slower, than torch's on small matrices
# (same file as above); generation batches are 16 (GRPO's groups) to 64 (eval) rows. In runtime.py: plan counts
# the copy.
MIN_ROWS = PREPACK_MIN_ROWS
# torch's CPU capabilities the reordered product was measured faster on (AVX512 covers AVX512_VNNI, ...).
CAPABILITIES = PREPACK_CAPABILITIES
_ACTIVE = "_tunelab_prepacked"


def applies(model: torch.nn.Module, rows: int) -> bool:
    """Whether `prepacked` reorders `model`'s weights for `rows` rows: fp32 weights, or bf16 ones where oneDNN has
    bf16 products, on an AVX2 or AVX-512 CPU, oneDNN present, no autocast to another dtype, enough rows."""
    param = next(model.parameters(), None)
    return (
        param is not None
        and param.device.type == "cpu"
        and rows >= MIN_ROWS
        and torch.backends.cpu.get_cpu_capability().startswith(CAPABILITIES)
        and torch.backends.mkldnn.is_available()
        and _dtype_applies(param.dtype)
    )


def _dtype_applies(dtype: torch.dtype) -> bool:
    """fp32 weights outside autocast; bf16 weights outside autocast or under bf16 autocast (their products run in
    bf16 either way), where oneDNN's bf16 products run."""
    autocast = torch.is_autocast_enabled("cpu")
    if dtype == torch.float32:
        return not autocast
    if dtype == torch.bfloat16:
        same = not autocast or torch.get_autocast_dtype("cpu") == torch.bfloat16
        return same and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return False


def reorder(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """`weight` (d_out, d_in) as a oneDNN tensor laid out for products with about `rows` rows (any count works)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), rows)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x·Wᵀ (+ bias) over a weight `reorder` laid out."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _packed_forward(module: torch.nn.Linear, packed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() or x.dtype != module.weight.dtype:
        return torch.nn.functional.linear(x, module.weight, module.bias)
    return linear(x, packed, module.bias)


@contextlib.contextmanager
def prepacked(model: torch.nn.Module, rows: int) -> Iterator[int]:
    """Within the block, `model`'s linear layers multiply without autograd over weights reordered once (see the
    module's docstring); yields how many layers. Weights must not change inside the block: it is for generation,
    between optimizer steps, with the adapter that was active on entry. Nested blocks reuse the outer one's
    weights. A layer whose forward someone else replaced (accelerate's offload hooks) keeps it. On a CPU, a fused
    LoRA layer that holds no [W | sB] (a compiled policy's, model/lora_linear.pack_for_inference) holds one for the
    block where its weight is not reordered (too few rows, or a dtype oneDNN has no reordered product for), so a
    compiled policy samples as fast as an eager one."""
    if getattr(model, _ACTIVE, False):
        yield 0
        return
    reorders = applies(model, rows)
    param = next(model.parameters(), None)
    on_cpu = param is not None and param.device.type == "cpu"
    dtype = param.dtype if param is not None else None
    fused, plain, covered = [], [], set()
    try:
        setattr(model, _ACTIVE, True)
        for module in model.modules():
            # tunelab's fused LoRA layers (model/lora_linear.py) reorder their own W + sBA (fp32) or [W | sB] (bf16).
            hook = getattr(module, "prepack_inference", None) if reorders else None
            base = hook(functools.partial(reorder, rows=rows)) if hook is not None else None
            if base is not None:  # its base and LoRA's A and B layers are read through it
                fused.append(module)
                covered.update(id(m) for m in module.modules())
            elif on_cpu and hasattr(module, "pack_while") and module.pack_while():
                fused.append(module)
        for module in model.modules() if reorders else ():
            linear = type(module) is torch.nn.Linear and module.weight.dtype == dtype
            if linear and id(module) not in covered and "forward" not in vars(module):
                module.forward = functools.partial(_packed_forward, module, reorder(module.weight, rows))
                plain.append(module)
        yield len(fused) + len(plain)
    finally:
        for module in fused:
            module.unpack_inference()
        for module in plain:
            del module.forward
        setattr(model, _ACTIVE, False)
