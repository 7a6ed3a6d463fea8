"""Decoding over weights reordered once into oneDNN's blocked layout, on CPUs that compute in fp32.

A decode step multiplies a few rows (one per completion) by every weight. torch's fp32 product (MKL's sgemm)
re-lays the weight out on every call when the rows are few: on an AVX-512 Xeon a 16-row step of the embedded model
ran at a third of what the same product over a weight laid out once takes, and on an AVX2-only Zen 3 the LM head's
product took 2.7-3.1x as long at 8-16 rows (benchmarks/design-decisions_cpu_2026-11-28.md#prepacked-decode-weights,
benchmarks/design-decisions_cpu_2026-11-29.md#prepacked-decode-weights-on-avx2). `prepacked` reorders each linear
layer's weight once for the length of a generation (a fused LoRA layer's W + sBA, B as it stands then) and
restores the layers on exit. It costs one more copy of the weights while it lasts; the results equal the plain
product's to fp32 rounding (the summation order differs). Applies to fp32 weights on an AVX2 or AVX-512 CPU
(torch's CPU capability) with oneDNN and at least `MIN_ROWS` rows; bf16 weights (the AMX and AVX-512 BF16 classes)
keep torch's product, not measured there.
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
    """Whether `prepacked` reorders `model`'s weights for `rows` rows: fp32 weights on an AVX2 or AVX-512 CPU, oneDNN
    present, no autocast to another dtype, enough rows."""
    param = next(model.parameters(), None)
    return (
        param is not None
        and param.device.type == "cpu"
        and param.dtype == torch.float32
        and rows >= MIN_ROWS
        and torch.backends.cpu.get_cpu_capability().startswith(CAPABILITIES)
        and torch.backends.mkldnn.is_available()
        and not torch.is_autocast_enabled("cpu")
    )


def reorder(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """`weight` (d_out, d_in) as a oneDNN tensor laid out for products with about `rows` rows (any count works)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), rows)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x·Wᵀ (+ bias) over a weight `reorder` laid out."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _packed_forward(module: torch.nn.Linear, packed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() or x.dtype != torch.float32:
        return torch.nn.functional.linear(x, module.weight, module.bias)
    return linear(x, packed, module.bias)


@contextlib.contextmanager
def prepacked(model: torch.nn.Module, rows: int) -> Iterator[int]:
    """Within the block, `model`'s linear layers multiply without autograd over weights reordered once (see the
    module's docstring); yields how many layers. Weights must not change inside the block: it is for generation,
    between optimizer steps. Nested blocks reuse the outer one's weights. A layer whose forward someone else
    replaced (accelerate's offload hooks) keeps it. On a CPU, a fused LoRA layer that holds no [W | sB] (a compiled
    policy's, model/lora_linear.pack_for_inference) holds one for the block where its weight is not reordered
    (bf16, or too few rows), so a compiled policy samples as fast as an eager one."""
    if getattr(model, _ACTIVE, False):
        yield 0
        return
    reorders = applies(model, rows)
    param = next(model.parameters(), None)
    on_cpu = param is not None and param.device.type == "cpu"
    fused, plain, covered = [], [], set()
    try:
        setattr(model, _ACTIVE, True)
        for module in model.modules():
            # tunelab's fused LoRA layers (model/lora_linear.py) reorder their own W + sBA.
            hook = getattr(module, "prepack_inference", None) if reorders else None
            base = hook(functools.partial(reorder, rows=rows)) if hook is not None else None
            if base is not None:  # its base and LoRA's A and B layers are read through it
                fused.append(module)
                covered.update(id(m) for m in module.modules())
            elif on_cpu and hasattr(module, "pack_while") and module.pack_while():
                fused.append(module)
        for module in model.modules() if reorders else ():
            plain_fp32 = type(module) is torch.nn.Linear and module.weight.dtype == torch.float32
            if plain_fp32 and id(module) not in covered and "forward" not in vars(module):
                module.forward = functools.partial(_packed_forward, module, reorder(module.weight, rows))
                plain.append(module)
        yield len(fused) + len(plain)
    finally:
        for module in fused:
            module.unpack_inference()
        for module in plain:
            del module.forward
        setattr(model, _ACTIVE, False)
