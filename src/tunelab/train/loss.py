"""The model as one module that returns the summed token loss, with the LM head applied only where needed.

Why not `model(input_ids, labels=...)`: that computes logits for every position (B·T·V, 49k vocab here)
and upcasts them all to fp32 for the loss. With prompt masking most positions have no target. We gather
the hidden states at the target positions first (indices computed on the host: no sync), then run the
head and the cross-entropy fused and in chunks, so at most one chunk of fp32 logits exists at a time.
On a CPU one fp32 log_softmax over a step's logits took longer than the model's own matmuls for that step
(benchmarks/design-decisions_cpu_2026-11-22.md#fused-chunked-head-and-loss).
"""

from __future__ import annotations

import torch

from .. import families
from ..data.packing import SeqLayout
from ..errors import TunelabError
from ..model import attention
from ..runtime import LOGIT_CHUNK

_SCRATCH: dict[tuple, torch.Tensor] = {}


def _scratch(name: str, shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A buffer kept across steps. Fresh tens-of-MB buffers are page-faulted in on every allocation (glibc
    mmaps anything over 32 MB), which makes a copy into a fresh buffer many times slower than into warm
    memory (benchmarks/design-decisions_cpu_2026-11-22.md#loss-scratch-buffers-kept-across-steps)."""
    key = (name, shape, dtype, device)
    buf = _SCRATCH.get(key)
    if buf is None:
        for old in [k for k in _SCRATCH if k[0] == name]:
            del _SCRATCH[old]
        buf = _SCRATCH[key] = torch.empty(shape, dtype=dtype, device=device)
    return buf


class LinearCrossEntropy(torch.autograd.Function):
    """Sum of cross-entropy of `hidden @ weight.T` against `targets`, never holding all logits.

    Each chunk's logits live only inside the forward: the loss and the gradient of the loss with respect to
    the logits (softmax - onehot) are both computed there, and only the small gradients with respect to
    `hidden` (K x h) and, when trainable, `weight` are kept for backward. This is the fused linear
    cross-entropy of Liger-Kernel (Hsu et al. 2024, arXiv 2410.10989), which ships only for GPUs.
    Logits are computed in the compute dtype and upcast to fp32 for the softmax, as autocast would.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, softcap, chunk):
        w = weight.to(hidden.dtype)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        low = _scratch("low", (chunk, w.shape[0]), hidden.dtype, hidden.device)
        full = _scratch("full", (chunk, w.shape[0]), torch.float32, hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            h, t = hidden[start : start + chunk], targets[start : start + chunk]
            n = h.shape[0]
            logits, squash = _chunk_logits(h, w, low[:n], full[:n], softcap)
            # One exp pass (exp is the costly part: ~3 ns/element here) gives both the log-sum-exp for the
            # loss and the softmax for the gradient.
            rows = torch.arange(n, device=t.device)
            target_logit = logits[rows, t]
            top = logits.amax(dim=-1, keepdim=True)
            probs = logits.sub_(top).exp_()
            total = probs.sum(dim=-1, keepdim=True)
            loss += (top.squeeze(1) + total.log().squeeze(1) - target_logit).sum()
            grad = probs.div_(total)
            grad[rows, t] -= 1.0
            if softcap:
                grad.mul_(1.0 - squash.square())
            grad = low[:n].copy_(grad)
            torch.mm(grad, w, out=grad_hidden[start : start + n])
            if grad_weight is not None:
                grad_weight += (grad.T @ h).float()
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        grad_w = None if grad_weight is None else (grad_weight * grad_loss).to(ctx.weight_dtype)
        return grad_hidden * grad_loss.to(grad_hidden.dtype), grad_w, None, None, None


def _chunk_logits(h, w, low, full, softcap):
    """One chunk's fp32 logits in `full` (the matmul in the compute dtype into `low`), soft-capped when
    `softcap` is set (Gemma-2's final logits: z -> c * tanh(z / c)); also tanh(z / c), which the gradient needs."""
    logits = full.copy_(torch.mm(h, w.T, out=low))
    if not softcap:
        return logits, None
    squash = torch.tanh(logits / softcap)
    logits.copy_(squash * softcap)
    return logits, squash


def token_loss_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    loss_index: torch.Tensor,
    loss_targets: torch.Tensor,
    softcap: float | None = None,
    chunk: int = LOGIT_CHUNK,
) -> torch.Tensor:
    """Sum of cross-entropy over the positions in `loss_index` (flat indices into hidden's B·T)."""
    selected = hidden.reshape(-1, hidden.shape[-1]).index_select(0, loss_index)
    device_type = selected.device.type
    if torch.is_autocast_enabled(device_type):
        selected = selected.to(torch.get_autocast_dtype(device_type))
    with torch.autocast(device_type, enabled=False):
        if not torch.is_grad_enabled():
            return loss_only(selected, weight, loss_targets, softcap, chunk)
        return LinearCrossEntropy.apply(selected, weight, loss_targets, softcap, chunk)


def loss_only(hidden, weight, targets, softcap, chunk) -> torch.Tensor:
    """LinearCrossEntropy's forward without its gradients, for evaluation: the same chunks, casts and
    arithmetic (so the same loss), without the second matmul per chunk that the gradient costs."""
    w = weight.to(hidden.dtype)
    loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
    low = _scratch("low", (chunk, w.shape[0]), hidden.dtype, hidden.device)
    full = _scratch("full", (chunk, w.shape[0]), torch.float32, hidden.device)
    for start in range(0, hidden.shape[0], chunk):
        h, t = hidden[start : start + chunk], targets[start : start + chunk]
        n = h.shape[0]
        logits, _ = _chunk_logits(h, w, low[:n], full[:n], softcap)
        rows = torch.arange(n, device=t.device)
        target_logit = logits[rows, t]
        top = logits.amax(dim=-1, keepdim=True)
        total = logits.sub_(top).exp_().sum(dim=-1, keepdim=True)
        loss += (top.squeeze(1) + total.log().squeeze(1) - target_logit).sum()
    return loss


class CausalLMLoss(torch.nn.Module):
    """Wraps a (peft-wrapped) causal LM; forward returns the summed loss, so DDP/autocast wrap it as usual."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        config = model.config
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.windows = tuple(sorted(families.sliding_windows(config)))
        if getattr(model.get_output_embeddings(), "bias", None) is not None:
            raise TunelabError(
                f"model: {getattr(config, 'model_type', '?')} has a bias on its LM head, which tunelab's fused "
                "loss does not add; this family is not supported"
            )
        implementation = getattr(config, "_attn_implementation", None)
        self.packed_attention = implementation == attention.NAME
        self.flex_attention = implementation == attention.FLEX_NAME

    def forward(
        self, input_ids, position_ids, loss_index, loss_targets, layout: SeqLayout | None = None
    ) -> torch.Tensor:
        decoder = self.model.get_decoder()
        if self.flex_attention and position_ids is not None:
            extra = attention.flex_tensors(position_ids, self.windows)
        elif self.packed_attention and layout is not None:
            extra = attention.layout_tensors(layout, input_ids.device)
        else:
            extra = {}
        out = decoder(input_ids=input_ids, position_ids=position_ids, use_cache=False, **extra)
        head = self.model.get_output_embeddings()
        return token_loss_sum(out.last_hidden_state, head.weight, loss_index, loss_targets, self.softcap)
