"""The CPU experts block as one native op (moe_native.cpp): each expert's whole MLP -- its rows gathered, gate_up
with its LoRA, the SiLU gate, down with its LoRA, its rows scattered back to (token, slot) order -- on one core, the
experts shared out between the cores largest first, forward and backward.

Why: at 8-64 experts of ~128 rows each, a product split over the cores by oneDNN's OpenMP team runs at a fraction
of one core's speed per core, and every op between them (pads, index copies, LoRA's tiles) is a parallel region of
its own. Inside `at::parallel_for` ATen, oneDNN and MKL run single-threaded, so one expert per core has no team to
split or spin (two Python threads over the experts did: benchmarks/peers/moe-peers-rounded_…_2026-12-07.md).

Built once per torch version with torch.utils.cpp_extension (g++ and ninja; ~8 s on a 2-core EPYC), cached in torch's
extensions directory (TORCH_EXTENSIONS_DIR). Where no compiler or ninja is present, or the build fails, `op()` says
so in one log line and returns None, and moe.py keeps its Python path. `TUNELAB_MOE_NATIVE=0` turns it off.
It serves the families whose experts are transformers' default gated SiLU without biases (Qwen3-MoE, Qwen2-MoE,
Mixtral, OLMoE); gpt-oss (biases, clamped gate) and 4-bit experts keep the Python path (`serves`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("moe_native.cpp")
ENV = "TUNELAB_MOE_NATIVE"  # "0": the Python path, no build
log = logging.getLogger("tunelab.moe")
_loaded: dict[str, object] = {}


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def op():
    """torch.ops.tunelab_moe, built or loaded once per process; None (one log line) where it cannot be built."""
    if "op" in _loaded:
        return _loaded["op"]
    _loaded["op"] = None
    try:
        from torch.utils.cpp_extension import is_ninja_available, load

        compiler = os.environ.get("CXX", "c++")
        if shutil.which(compiler) is None or not is_ninja_available():
            log.warning("MoE native experts: no C++ compiler (%s) or ninja here; the Python path runs", compiler)
            return None
        text = SOURCE.read_bytes()
        # built for this CPU (-march=native: LoRA's row kernels vectorise to its widest units), so its flags name it
        digest = hashlib.sha256(text + torch.__version__.encode() + _cpu_flags().encode()).hexdigest()[:12]
        load(
            name=f"tunelab_moe_{digest}",
            sources=[str(SOURCE)],
            extra_cflags=["-O3", "-march=native"],
            is_python_module=False,
            verbose=False,
        )
        _loaded["op"] = torch.ops.tunelab_moe
    except Exception as error:  # a failed build: the Python path, said once
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        log.warning("MoE native experts: build failed (%s); the Python path runs", first[:200])
    return _loaded["op"]


def _cpu_flags() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((line for line in lines if line.startswith(("flags", "Features"))), "")


def serves(experts, hidden: torch.Tensor) -> bool:
    """Whether the native block runs `experts` on `hidden`: a CPU tensor, transformers' default gated SiLU, no
    biases, 16- or 32-bit stacks (not QLoRA's 4-bit), and the op built."""
    from transformers.integrations import moe as hf_moe

    gated = experts.has_gate and type(experts)._apply_gate is hf_moe._default_apply_gate
    silu = type(getattr(experts, "act_fn", None)).__name__ in ("SiLU", "SiLUActivation")
    return (
        enabled()
        and hidden.device.type == "cpu"
        and gated
        and silu
        and not experts.has_bias
        and not getattr(experts, "tunelab_nf4", None)
        and op() is not None
    )


class ExpertsBlock(torch.autograd.Function):
    """Σ over each token's k experts is left to the caller: this returns every (token, slot) pair's expert output
    (T·k, H). `slot` is the pairs sorted by expert, `counts` each expert's pairs; wgu (E, H, 2I), wd (E, I, H) as
    views in any strides; a1 (E, H, r), b1 (E, r, 2I), a2, b2 LoRA's factors with the scale in the b's (empty
    tensors: no LoRA on that projection)."""

    @staticmethod
    def forward(ctx, hidden, wgu, wd, a1, b1, a2, b2, slot, counts, top_k):
        ops = op()
        out, x, gu, h1, h2 = ops.experts_forward(hidden, slot, counts, wgu, wd, a1, b1, a2, b2, top_k)
        ctx.save_for_backward(slot, counts, wgu, wd, a1, b1, a2, b2, x, gu, h1, h2)
        ctx.top_k = top_k
        ctx.weights = wgu.requires_grad or wd.requires_grad
        return out

    @staticmethod
    def backward(ctx, dout):
        slot, counts, wgu, wd, a1, b1, a2, b2, x, gu, h1, h2 = ctx.saved_tensors
        dh, dwgu, dwd, da1, db1, da2, db2 = op().experts_backward(
            dout.to(x.dtype), slot, counts, wgu, wd, a1, b1, a2, b2, x, gu, h1, h2, ctx.top_k, ctx.weights
        )
        none = lambda t, need: t if need and t.numel() else None  # noqa: E731
        need = ctx.needs_input_grad
        return (
            dh if need[0] else None,
            none(dwgu, need[1]),
            none(dwd, need[2]),
            none(da1, need[3]),
            none(db1, need[4]),
            none(da2, need[5]),
            none(db2, need[6]),
            None,
            None,
            None,
        )
