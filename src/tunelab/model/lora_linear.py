"""LoRA linear layers whose update survives bf16: base and adapter products summed in one fp32 accumulator.

peft computes `base(x) + B(A(x)) * s` as separate ops. In bf16 the base product is rounded to the bf16
grid first; any adapter update smaller than half a unit in the last place of that output (2⁻⁹ relative)
is then rounded away entirely, not approximately: round(b + d) == b whenever b is on the grid and
|d| < ulp(b)/2. Early in training, with B starting at zero, most updates are that small, so the forward
pass does not see what the optimizer did while the backward pass reports gradients as if it did.
On the quickstart the same weights give a visibly different loss through peft's bf16 path and in fp32
(benchmarks/design-decisions_cpu_2026-11-22.md#lora-update-under-bf16-rounding).

Here the adapter's rank-r activations are appended to the input and the scaled B to the weight, so one
GEMM computes [x | xAᵀ] · [W | sB]ᵀ = xWᵀ + s·xAᵀBᵀ with a single rounding at the end (the GEMM
accumulates in fp32). The same trick needs no elementwise pass for the scaling or the add, which in
peft's form are two full passes over the output per layer, forward and backward.

Backward: with g = dL/dy and gb = g·(sB) (T x r),
  dL/dx = g·(W + sB·A),   dL/dA = gbᵀ·x,   dL/dB = s·gᵀ·(xAᵀ).
dL/dx goes through the merged weight in one GEMM rather than g·W + gb·A: the second form is a T x r x d_in
addmm whose bias operand is first copied into its output, two more passes over a T x d_in tensor for each
layer. Merging costs one d_out x r x d_in product. Rounding W + sB·A to bf16 drops the sub-ulp part of the
update from the input gradient only (the forward keeps it); g·W followed by the addmm rounded twice.
The merged form made the quickstart's backward faster
(benchmarks/design-decisions_cpu_2026-11-22.md#input-gradient-through-the-merged-weight).

QLoRA: an nf4 base (bitsandbytes Linear4bit) has the same problem, since bitsandbytes rounds its own
product to bf16 before peft adds the update. Its weight is dequantized to the compute dtype for the GEMM,
as bitsandbytes does itself, and dequantized again in backward instead of being kept: keeping one
dequantized copy per layer would give back the memory that the nf4 base saves.
"""

from __future__ import annotations

import functools

import torch
from peft.tuners.lora import Linear as PeftLoraLinear

from ..device import compute_dtype
from ..runtime import hashed_dropout
from .prepack import linear as prepacked_linear


def _fused_product(
    x2: torch.Tensor, dropped: torch.Tensor, a: torch.Tensor, weight_cat: torch.Tensor, bias: torch.Tensor | None
):
    """(y, dropped·Aᵀ) with y = [x | dropped·Aᵀ]·[W | sB]ᵀ (+ bias): one GEMM, one rounding; all in x2's
    dtype. `dropped` is the adapter's input: x itself, or x after LoRA dropout."""
    xa = dropped @ a.T
    y = torch.cat([x2, xa], dim=1) @ weight_cat.T
    if bias is not None:
        y += bias.to(y.dtype)
    return y, xa


def _hash_bits(shape: torch.Size, seed: torch.Tensor) -> torch.Tensor:
    """32 pseudo-random bits per element: the lowbias32 finalizer (C. Wellons, "Hash function prospector",
    2018) of (index + seed) mod 2³², with `seed` an int64 holding 32 bits. Counter-based like Philox, so
    inductor compiles it into the kernel that uses the bits. Two calls read one sequence at two random
    offsets; their masks are independent unless the offsets lie within a mask's length of each other, and
    then one is the other shifted, elements of other positions and features. One round, because a second one
    cost end-to-end speed (benchmarks/design-decisions_cpu_2026-11-22.md#one-finalizer-round-for-the-dropout-hash).
    Products stay below 2⁶³: multiplying by 0x846CA68B = 2³² - 0x7B935975 is, mod 2³², negating a product by
    0x7B935975."""
    bits = (torch.arange(shape.numel(), device=seed.device, dtype=torch.int64).view(shape) + seed) & 0xFFFFFFFF
    bits = ((bits ^ (bits >> 16)) * 0x7FEB352D) & 0xFFFFFFFF
    bits = -((bits ^ (bits >> 15)) * 0x7B935975) & 0xFFFFFFFF
    return bits ^ (bits >> 16)


def _hashed_keep(shape: torch.Size, seed: torch.Tensor, p: float) -> torch.Tensor:
    """LoRA dropout's keep mask drawn from `_hash_bits`: a pure function of the seed, so backward can draw
    it again instead of keeping it."""
    return _hash_bits(shape, seed) >= round(p * 2**32)


def _dropped(x: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    """Inverted dropout: the kept elements scaled by 1 / (1 - p), as nn.Dropout does."""
    return x * keep / (1.0 - p)


class _LoraLinearFn(torch.autograd.Function):
    """`weight` is the dense base weight, or None with `dequantize` giving it (a quantized base).

    With LoRA dropout p > 0 the adapter reads a dropped copy of x (peft's `lora_B(lora_A(dropout(x)))`):
    [x | drop(x)Aᵀ]·[W | sB]ᵀ is still one GEMM. The input gradient takes the base and adapter terms apart,
    g·W + (gb·A) ⊙ mask / (1 - p), since the mask does not factor through the merged weight.

    The mask: compiled on CPU it comes from `_hashed_keep` with one random seed per call, and backward draws
    it again from the seed and keeps x, not the copy and the mask. Why: inductor's CPU random numbers are slow
    and dropout draws one for every element of every adapted input, while the hash fuses into the kernel that
    makes the dropped copy, which storing a mask for backward would slow down again; its masks drop p of the
    elements with a binomial's per-row spread
    (benchmarks/design-decisions_cpu_2026-11-22.md#lora-dropout-mask-drawn-again-in-backward).
    Elsewhere torch.rand, and backward keeps copy and mask."""

    @staticmethod
    def forward(
        ctx, x, weight, bias, lora_a, lora_b, scaling: float, dequantize=None, dropout: float = 0.0, packed=None
    ):
        dtype = compute_dtype(x)
        lead, width = x.shape[:-1], x.shape[-1]
        with torch.autocast(x.device.type, enabled=False):
            x2 = x.reshape(-1, width).to(dtype)
            keep, seed, dropped = None, None, x2
            if dropout:
                if hashed_dropout(x2.device.type, torch.compiler.is_compiling()):
                    seed = torch.randint(0, 2**32, (), device=x2.device, dtype=torch.int64)
                    keep = _hashed_keep(x2.shape, seed, dropout)
                else:
                    keep = torch.rand_like(x2, dtype=torch.float32) >= dropout
                dropped = _dropped(x2, keep, dropout)
            a = lora_a.to(dtype)
            b = (lora_b * scaling).to(dtype)
            w = (weight if dequantize is None else dequantize()).to(dtype)
            if packed is not None and packed.dtype == dtype:  # [W | sB] held by pack_for_inference: write sB only
                packed[:, width:].copy_(b)
                weight_cat = packed
            else:
                weight_cat = torch.cat([w, b], dim=1)
            y, xa = _fused_product(x2, dropped, a, weight_cat, bias)
        base_w = w if dequantize is None else None
        if seed is not None:  # backward draws the mask again: keep x and the seed, not the copy and the mask
            ctx.save_for_backward(x2, xa, a, b, base_w, seed)
        else:
            ctx.save_for_backward(dropped, xa, a, b, base_w, keep)
        ctx.dequantize, ctx.scaling, ctx.lead, ctx.dropout = dequantize, scaling, lead, dropout
        ctx.hashed = seed is not None
        ctx.param_dtypes = (lora_a.dtype, lora_b.dtype)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.view(*lead, y.shape[-1])

    @staticmethod
    def backward(ctx, grad_out):
        saved_in, xa, a, b, w, mask_or_seed = ctx.saved_tensors
        if ctx.hashed:
            keep = _hashed_keep(saved_in.shape, mask_or_seed, ctx.dropout)
            dropped = _dropped(saved_in, keep, ctx.dropout)
        else:
            keep, dropped = mask_or_seed, saved_in
        with torch.autocast(dropped.device.type, enabled=False):
            g = grad_out.reshape(-1, grad_out.shape[-1]).to(dropped.dtype)
            gb = g @ b
            grad_x = None
            if ctx.needs_input_grad[0]:
                if w is None:
                    w = ctx.dequantize().to(dropped.dtype)
                if keep is None:
                    grad_x = g @ torch.addmm(w, b, a)
                else:
                    grad_x = g @ w + _dropped(gb @ a, keep, ctx.dropout)
                grad_x = grad_x.view(*ctx.lead, w.shape[1])
            grad_a = (gb.T @ dropped).to(ctx.param_dtypes[0])
            grad_b = (g.T @ xa).to(ctx.param_dtypes[1]).mul_(ctx.scaling)
            grad_bias = g.sum(0).to(ctx.bias_dtype) if ctx.needs_input_grad[2] else None
        return grad_x, None, grad_bias, grad_a, grad_b, None, None, None, None


def _is_nf4(base: torch.nn.Module) -> bool:
    """A bitsandbytes Linear4bit base that has been quantized (it has a quant state)."""
    return type(base).__name__ == "Linear4bit" and getattr(base.weight, "quant_state", None) is not None


def has_nf4_base(model: torch.nn.Module) -> bool:
    """Whether any layer of `model` is a quantized bitsandbytes Linear4bit."""
    return nf4_layers(model) > 0


def nf4_layers(model: torch.nn.Module) -> int:
    """How many layers of `model` are quantized bitsandbytes Linear4bit, or 4-bit stacked expert projections
    (model/moe.py quantize_experts): what a QLoRA run trains over."""
    return sum(_is_nf4(module) + len(getattr(module, "tunelab_nf4", ())) for module in model.modules())


def has_lora_dropout(model: torch.nn.Module) -> bool:
    """Whether any fused LoRA layer of `model` applies dropout (p > 0)."""
    return any(
        isinstance(drop, torch.nn.Dropout) and drop.p > 0
        for module in model.modules()
        if isinstance(module, _FusedForward)
        for drop in module.lora_dropout.values()
    )


def _nf4_dequantizer(base: torch.nn.Module):
    """A function giving an nf4 base's weight dequantized."""
    from bitsandbytes.functional import dequantize_4bit

    weight = base.weight
    return lambda: dequantize_4bit(weight.data, weight.quant_state)


def _dense(base: torch.nn.Module) -> bool:
    """A plain Linear whose weight is a whole tensor (not FSDP's shard of it), which a layer may lay out again."""
    return type(base) is torch.nn.Linear and type(base.weight.detach()) is torch.Tensor


class _FusedForward:
    """The fused forward for peft's LoRA layers; mixed into peft's own classes, so the state dict and the
    saved adapter are peft's. It covers the plain case (one active LoRA adapter, unmerged, no DoRA, a dense
    or nf4 base weight, LoRA dropout or none); anything else (an int8 base, say) takes peft's own forward."""

    _packed: torch.Tensor | None = None  # see pack_for_inference
    _prepacked: torch.Tensor | None = None  # W + sBA (fp32) or [W | sB] (bf16) reordered for CPU decoding (prepack.py)
    _prepacked_dtype: torch.dtype | None = None  # the dtype of x it multiplies
    _prepacked_a: torch.Tensor | None = None  # with a bf16 [W | sB]: A in bf16, cast once for the block
    _prepacked_name: str | None = None  # the adapter the block reordered, the one it reads throughout
    _packed_while = False  # `_packed` is pack_while's copy, dropped by unpack_inference

    def _inference_forward(self, x: torch.Tensor, name: str, packed: torch.Tensor | None) -> torch.Tensor | None:
        """Without autograd, over a packed weight: [x | xAᵀ]·[W | sB]ᵀ with no weight concatenated per call.
        The sB columns are rewritten on every call (d_out x r values, beside the d_out x d_in product): B's
        version counter cannot tell whether B changed, since a fused AdamW step updates it in place without
        bumping it, and GRPO samples between optimizer steps."""
        if torch.is_grad_enabled() or self._dropout_p(name):
            return None
        width = x.shape[-1]
        x2 = x.reshape(-1, width)
        if self._prepacked is not None and x.dtype == self._prepacked_dtype:  # B as it stood when reordered
            if self._prepacked_a is None:  # fp32: W + sBA
                y = prepacked_linear(x2, self._prepacked, self.base_layer.bias)
            else:  # bf16: [x | xAᵀ]·[W | sB]ᵀ as _fused_product computes it, over the reordered [W | sB]
                xa = x2 @ self._prepacked_a.T
                y = prepacked_linear(torch.cat([x2, xa], dim=1), self._prepacked, None)
                if self.base_layer.bias is not None:
                    y += self.base_layer.bias.to(y.dtype)
            return y.view(*x.shape[:-1], y.shape[-1])
        if packed is None or x.dtype != packed.dtype:
            return None
        # copy_, not torch.mul(..., out=): dynamo cannot trace an out= view, and broke the compiled decode step's graph
        # in every layer (a resume function per layer, past the recompile limit); the same rounding to packed's dtype.
        packed[:, width:].copy_(self.lora_B[name].weight * self.scaling[name])
        y, _ = _fused_product(x2, x2, self.lora_A[name].weight.to(x.dtype), packed, self.base_layer.bias)
        return y.view(*x.shape[:-1], y.shape[-1])

    def prepack_inference(self, reorder) -> torch.nn.Module | None:
        """For a dense base, keep for the inference calls until `unpack_inference`, B as it stands now: in fp32
        `reorder(W + sBA)` (one product per call: no xAᵀ, no concatenation; in fp32 the merge's rounding is the
        product's own); in bf16 `reorder([W | sB])` and A in bf16, the packed layer's product over a reordered
        weight (merging would round the update away: `pack_for_inference`), with no per-call write of sB or cast of
        A. Returns the base layer that covers, else None. Packed by `pack_for_inference` or not (a compiled policy's
        layers are not: see `pack_while`)."""
        name = self._fused_adapter()
        base = self.base_layer
        if name is None or not _dense(base) or base.weight.dtype not in (torch.float32, torch.bfloat16):
            return None
        with torch.no_grad():
            weight = base.weight.detach()
            if weight.dtype == torch.float32:
                lora_a, lora_b = self.lora_A[name].weight.float(), self.lora_B[name].weight.float()
                self._prepacked = reorder(torch.addmm(weight, lora_b, lora_a, alpha=self.scaling[name]))
            else:  # the values _LoraLinearFn and _inference_forward compute: (B·s) and A cast to bf16
                scaled = (self.lora_B[name].weight * self.scaling[name]).to(weight.dtype)
                self._prepacked = reorder(torch.cat([weight, scaled], dim=1))
                self._prepacked_a = self.lora_A[name].weight.detach().to(weight.dtype)
        self._prepacked_dtype, self._prepacked_name = weight.dtype, name
        return base

    def pack_while(self) -> bool:
        """If this dense layer holds no [W | sB] (a compiled policy's: the compiled update cannot trace W as a
        view that the refresh writes into), hold one as a copy until `unpack_inference`, so the inference calls
        take `_inference_forward` as a packed layer's do; whether it did. One more copy of W while it lasts."""
        name = self._fused_adapter()
        base = self.base_layer
        if self._packed is not None or name is None or not _dense(base):
            return False
        with torch.no_grad():
            weight = base.weight.detach()
            scaled = (self.lora_B[name].weight * self.scaling[name]).to(weight.dtype)
            self._packed = torch.cat([weight, scaled], dim=1)
        self._packed_while = True
        return True

    def unpack_inference(self) -> None:
        """Drop what `prepack_inference` and `pack_while` kept."""
        self._prepacked = self._prepacked_a = self._prepacked_name = None
        if self._packed_while:
            self._packed, self._packed_while = None, False

    def _fused_adapter(self) -> str | None:
        if self.disable_adapters or self.merged or len(self.active_adapters) != 1:
            return None
        name = self.active_adapters[0]
        if name not in self.lora_A or name in self.lora_variant:
            return None
        if not isinstance(self.lora_dropout[name], (torch.nn.Identity, torch.nn.Dropout)):
            return None
        if type(self.base_layer) is not torch.nn.Linear and not _is_nf4(self.base_layer):
            return None
        return name

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if self._prepacked_name is not None and not (args or kwargs):  # inside prepacked: its adapter, unchanged
            y = self._inference_forward(x, self._prepacked_name, None)
            if y is not None:
                return y
        name = None if args or kwargs else self._fused_adapter()
        if name is None:
            return super().forward(x, *args, **kwargs)
        packed = self._packed
        if packed is not None and packed.shape[1] != x.shape[-1] + self.lora_A[name].weight.shape[0]:
            packed = None  # packed for another adapter of another rank (`tunelab serve` switches adapters)
        if packed is not None or self._prepacked is not None:
            y = self._inference_forward(x, name, packed)
            if y is not None:
                return y
        base = self.base_layer
        dequantize = None if type(base) is torch.nn.Linear else _nf4_dequantizer(base)
        return _LoraLinearFn.apply(
            x,
            # `is None`: torch 2.11's dynamo cannot take the truth value of a function and breaks the graph.
            base.weight if dequantize is None else None,
            base.bias,
            self.lora_A[name].weight,
            self.lora_B[name].weight,
            self.scaling[name],
            dequantize,
            self._dropout_p(name),
            packed,
        )

    def _dropout_p(self, name: str) -> float:
        """The LoRA dropout probability in effect: 0 without dropout or in eval mode (nn.Dropout's rule)."""
        drop = self.lora_dropout[name]
        return drop.p if isinstance(drop, torch.nn.Dropout) and drop.training else 0.0


class LoraLinear(_FusedForward, PeftLoraLinear):
    """peft's LoRA Linear with the fused forward."""


@functools.cache
def _fused_nf4_class(peft_class: type) -> type:
    """peft's LoRA layer over a bitsandbytes Linear4bit base, with the fused forward. Made on first use:
    peft defines that class only where bitsandbytes is installed."""
    return type("LoraLinear4bit", (_FusedForward, peft_class), {"__doc__": "peft's nf4 LoRA layer, fused forward."})


def pack_for_inference(model: torch.nn.Module) -> int:
    """Re-home each fused layer's dense base weight W into one (d_out, d_in + r) matrix [W | sB], W becoming a
    view of its left part; returns how many layers. For evaluation and generation: the fused forward
    otherwise concatenates [W | sB] on every call, and generation calls every layer once per new token.
    Packing made scoring faster; merging the adapter into plain bf16 weights would be faster still but scores
    lower, the merge rounding small updates away
    (benchmarks/design-decisions_cpu_2026-11-22.md#packed-weight-for-inference). Memory stays one copy of W
    (the old storage is freed as each layer is re-homed). With autograd on (training) the layer takes the
    ordinary fused path."""
    count = 0
    for module in model.modules():
        if not isinstance(module, _FusedForward):
            continue
        name = module._fused_adapter()
        if name is None or type(module.base_layer) is not torch.nn.Linear:
            continue
        base = module.base_layer
        weight = base.weight.detach()
        lora_b = module.lora_B[name].weight
        packed = torch.cat([weight, (lora_b.detach() * module.scaling[name]).to(weight.dtype)], dim=1)
        base.weight = torch.nn.Parameter(packed[:, : weight.shape[1]], requires_grad=base.weight.requires_grad)
        module._packed = packed
        count += 1
    return count


def fused_layer_weights(model: torch.nn.Module) -> list[tuple[torch.nn.Module, torch.nn.Parameter]]:
    """(layer, weight) for every weight a fused LoRA layer reads itself, outside the forward of the module that
    holds it: the base weight (dense, or nf4 for the dequantizer) and bias, and LoRA's A and B (the fused
    forward reads them all and calls none of their modules)."""
    pairs = []
    for m in model.modules():
        if not isinstance(m, _FusedForward) or m._fused_adapter() is None:
            continue
        pairs.append((m, m.base_layer.weight))
        if m.base_layer.bias is not None:
            pairs.append((m, m.base_layer.bias))
        for name in m.lora_A:
            pairs += [(m, m.lora_A[name].weight), (m, m.lora_B[name].weight)]
    return pairs


def use_fused_lora(model: torch.nn.Module) -> int:
    """Switch peft's LoRA layers over dense and nf4 bases in `model` to the fused forward; returns how many."""
    count = 0
    for module in model.modules():
        cls = type(module)
        if cls is PeftLoraLinear:
            module.__class__ = LoraLinear
        elif cls.__module__ == "peft.tuners.lora.bnb" and cls.__name__ == "Linear4bit":
            module.__class__ = _fused_nf4_class(cls)
        else:
            continue
        count += 1
    return count
