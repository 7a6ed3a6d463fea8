"""The optimizers, one row each: the bytes of state each trainable parameter costs, what the optimizer needs to
run, whether it can step one parameter at a time inside backward, and what to use where it cannot run. Config
validation, plan, the recipe and checkpoints read this registry and never compare optimizer names, so a new
optimizer is one row here plus the builder it names. Torch-free and import-free: config and plan read it; a row
names its builder as `package.module:attribute` under tunelab, imported only when `load` is called."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

# bitsandbytes' blockwise 8-bit states: one byte per value and one fp32 absmax per block of 256 values
# (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization", section 2), for each of Adam's two
# moments. bitsandbytes keeps tensors under `min_8bit_size` (4096 values: norms, biases) in fp32, which plan
# leaves out: they are below 0.1% of a transformer's parameters.
_BLOCKWISE_8BIT = 2 * (1 + 4 / 256)


@dataclass(frozen=True)
class Optimizer:
    name: str
    # Bytes of optimizer state per trainable parameter, beside the weights and their gradients.
    state_bytes: float
    # `package.module:attribute` under tunelab: `build(params, lr, weight_decay, device)` -> a torch optimizer.
    builder: str
    # Factored second moment (Adafactor, Shazeer & Stern 2018, section 3): a row and a column vector of fp32 per
    # matrix, 4 (rows + cols) bytes, instead of `state_bytes` per parameter; vectors keep a full fp32 moment.
    factored: bool = False
    # Needs bitsandbytes' optimizers (its 8-bit kernels run on CUDA and, since bitsandbytes 0.45, on CPU).
    bitsandbytes: bool = False
    # Paged states: on CUDA they live in unified memory that the driver evicts to host memory under pressure, so a
    # step's transient spike does not end the run; elsewhere bitsandbytes keeps them in ordinary memory.
    paged: bool = False
    # Needs a CUDA device; `instead` names what to use elsewhere.
    needs_cuda: bool = False
    # Can step each parameter in its gradient hook (optimizer_in_backward): its update reads that parameter's
    # gradient and state alone.
    in_backward: bool = True
    # What to use where this optimizer cannot run, named in the refusal.
    instead: str = "adamw"
    # Bytes per value its step allocates and frees beyond the weight, gradient and states, measured on CPU
    # (benchmarks/optimizers/step-memory_xeon-fp32-2c_2026-11-27.md): fused AdamW none, bitsandbytes' 8-bit step
    # its dequantized moments and update, Adafactor its update and squared gradient. Taken for CUDA too, unmeasured.
    # Above 0, a full fine-tune on a CPU returns its freed pages before each step (recipes/finetune.py).
    step_scratch: float = 0.0

    @property
    def elementwise(self) -> bool:
        """Each value's update reads only that value's gradient and state (bitsandbytes' 256-value blocks aside,
        which chunks aligned to 256 keep), so a large bf16 weight can step in chunks (runtime.STEP_CHUNK) with the
        same result; a factored second moment spans the whole matrix."""
        return not self.factored

    def returns_pages_before_step(self, in_backward: bool) -> bool:
        """Whether a full fine-tune on a CPU returns the pages backward freed just before each step (its step
        allocates scratch, and runs after backward, not inside it): its peak, in that step, then holds no freed
        pages (plan/memory.py, allocator.return_freed_pages)."""
        return self.step_scratch > 0 and not in_backward

    def state_bytes_of(self, rows: int, cols: int) -> float:
        """Optimizer state of one trainable (rows x cols) matrix, or of a vector when `cols` is 1."""
        if self.factored and cols > 1:
            return 4.0 * (rows + cols)
        return self.state_bytes * rows * cols


REGISTRY: dict[str, Optimizer] = {
    o.name: o
    for o in (
        # torch's AdamW: exp_avg and exp_avg_sq, fp32.
        Optimizer("adamw", state_bytes=8, builder="train.optim:build_adamw"),
        Optimizer(
            "adamw_8bit",
            state_bytes=_BLOCKWISE_8BIT,
            builder="train.optim:build_adamw_8bit",
            bitsandbytes=True,
            step_scratch=18,
        ),
        Optimizer(
            "paged_adamw_8bit",
            state_bytes=_BLOCKWISE_8BIT,
            builder="train.optim:build_paged_adamw_8bit",
            bitsandbytes=True,
            step_scratch=18,
            paged=True,
            # bitsandbytes falls back to ordinary memory off CUDA (a warning): adamw_8bit, said plainly.
            needs_cuda=True,
            instead="adamw_8bit",
        ),
        # torch's Adafactor (no first moment, factored second moment): the low-memory choice on every device.
        Optimizer("adafactor", state_bytes=4, builder="train.optim:build_adafactor", factored=True, step_scratch=6),
    )
}
NAMES = tuple(REGISTRY)
# TrainingArguments' `optim` values an HF script uses -> (the row whose states it keeps, whether its step is one
# fused kernel per parameter group): bitsandbytes' 8-bit steps are fused; `adamw_torch` is torch's foreach path.
# plan's HF stack (plan/hfstack.py) reads it.
HF_OPTIMS: dict[str, tuple[str, bool]] = {
    "adamw_torch": ("adamw", False),
    "adamw_torch_fused": ("adamw", True),
    "adamw_8bit": ("adamw_8bit", True),
    "adamw_bnb_8bit": ("adamw_8bit", True),
    "paged_adamw_8bit": ("paged_adamw_8bit", True),
    "adafactor": ("adafactor", False),
}


def get(name: str) -> Optimizer:
    return REGISTRY[name]


def load(row: Optimizer) -> Any:
    """The builder a row names, imported now (its module imports torch)."""
    module, _, attr = row.builder.partition(":")
    return getattr(importlib.import_module(f"tunelab.{module}"), attr)
