"""The model as one module that returns the summed token loss, with the LM head applied only where needed, and the
chunked head every objective scores tokens with.

Why not `model(input_ids, labels=...)`: that computes logits for every position (B·T·V, 49k vocab here)
and upcasts them all to fp32 for the loss. With prompt masking most positions have no target. We gather
the hidden states at the target positions first (indices computed on the host: no sync), then run the
head and the cross-entropy fused and in chunks, so at most one chunk of fp32 logits exists at a time.
On a CPU one fp32 log_softmax over a step's logits took longer than the model's own matmuls for that step
(benchmarks/design-decisions_cpu_2026-11-22.md#fused-chunked-head-and-loss).

`head_pass` is that chunk loop, written once: each target's negative log-probability, optionally its distribution's
entropy, and the gradients of the negative log-probabilities with respect to the hidden states and the head.
`token_loss_sum` (supervised cross-entropy) and `score_tokens` (per-token log-probabilities and entropies: the
preference objectives, and any objective that scores sampled tokens) are its two public faces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

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


@dataclass
class HeadPass:
    """What one pass of the chunked head computed over K target rows; the optional parts only when asked for."""

    nll_sum: torch.Tensor  # fp32 scalar: the rows' -log p(target), summed chunk by chunk
    logps: torch.Tensor | None = None  # fp32 (K,): each row's log p(target)
    entropy: torch.Tensor | None = None  # fp32 (K,): each row's distribution's entropy, without a gradient
    grad_hidden: torch.Tensor | None = None  # (K, h), hidden's dtype: row i is d nll_i / d hidden_i
    grad_weight: torch.Tensor | None = None  # fp32, weight's shape: sum over rows of scale_i · d nll_i / d weight


def head_pass(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    softcap: float | None,
    chunk: int,
    *,
    rows: bool = False,
    entropy: bool = False,
    grad_hidden: bool = False,
    grad_weight: bool = False,
    scale: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> HeadPass:
    """The head `hidden @ weight.T` over `hidden`'s rows (already gathered at the targets), `chunk` rows at a time.

    Logits are computed in the compute dtype and upcast to fp32 for the softmax, as autocast would. Each chunk's
    gradient with respect to its logits (softmax - onehot, through the soft cap's tanh) is formed here, while the
    logits exist, so no caller keeps them for backward: `grad_hidden` and `grad_weight` ask for its products with
    the head and with the hidden states. `scale` (fp32, one factor per row) multiplies each row's gradient first,
    for a backward that needs a per-token factor inside the head's sum over rows. `temperature` divides the
    (soft-capped) logits, as a sampler at that temperature does: the log-probs of the distribution sampled from.
    """
    w = weight.to(hidden.dtype)
    k = hidden.shape[0]
    f32 = {"dtype": torch.float32, "device": hidden.device}
    out = HeadPass(
        nll_sum=torch.zeros((), **f32),
        logps=torch.empty(k, **f32) if rows else None,
        entropy=torch.empty(k, **f32) if entropy else None,
        grad_hidden=torch.empty_like(hidden) if grad_hidden else None,
        grad_weight=torch.zeros_like(weight, dtype=torch.float32) if grad_weight else None,
    )
    low = _scratch("low", (chunk, w.shape[0]), hidden.dtype, hidden.device)
    full = _scratch("full", (chunk, w.shape[0]), torch.float32, hidden.device)
    for start in range(0, k, chunk):
        h, t = hidden[start : start + chunk], targets[start : start + chunk]
        n = h.shape[0]
        logits, squash = _chunk_logits(h, w, low[:n], full[:n], softcap, temperature)
        index = torch.arange(n, device=t.device)
        target_logit = logits[index, t]
        top = logits.amax(dim=-1, keepdim=True)
        shifted = logits.sub_(top)
        if entropy:  # H = log Σ e^s - Σ softmax·s over the shifted logits s, which the exp below overwrites
            kept = _scratch("shifted", (chunk, w.shape[0]), torch.float32, hidden.device)[:n].copy_(shifted)
        # One exp pass (exp is the costly part: ~3 ns/element here) gives the log-sum-exp of the loss, the
        # softmax of the gradient and the entropy's weights.
        probs = shifted.exp_()
        total = probs.sum(dim=-1, keepdim=True)
        top, log_total = top.squeeze(1), total.log().squeeze(1)
        out.nll_sum += (top + log_total - target_logit).sum()
        if rows:
            out.logps[start : start + n] = target_logit - top - log_total
        if entropy:
            out.entropy[start : start + n] = log_total - kept.mul_(probs).sum(dim=-1) / total.squeeze(1)
        if grad_hidden or grad_weight:
            grad = probs.div_(total)
            grad[index, t] -= 1.0
            if softcap:
                grad.mul_(1.0 - squash.square())
            if temperature != 1.0:
                grad.div_(temperature)
            if scale is not None:
                grad.mul_(scale[start : start + n, None])
            grad = low[:n].copy_(grad)  # rounded to the compute dtype once, for both products
            if out.grad_hidden is not None:
                torch.mm(grad, w, out=out.grad_hidden[start : start + n])
            if out.grad_weight is not None:
                # added into the fp32 sum as it is (the add upcasts each value): no fp32 copy of the increment
                out.grad_weight += grad.T @ h
    return out


def _chunk_logits(h, w, low, full, softcap, temperature=1.0):
    """One chunk's fp32 logits in `full` (the matmul in the compute dtype into `low`), soft-capped when
    `softcap` is set (Gemma-2's final logits: z -> c * tanh(z / c)), then divided by `temperature`; also
    tanh(z / c), which the gradient needs."""
    logits = full.copy_(torch.mm(h, w.T, out=low))
    squash = None
    if softcap:
        squash = torch.tanh(logits / softcap)
        logits.copy_(squash * softcap)
    if temperature != 1.0:
        logits.div_(temperature)
    return logits, squash


class LinearCrossEntropy(torch.autograd.Function):
    """Sum of cross-entropy of `hidden @ weight.T` against `targets`, never holding all logits.

    Each chunk's logits live only inside the forward: the loss and the gradient of the loss with respect to
    the logits (softmax - onehot) are both computed there, and only the small gradients with respect to
    `hidden` (K x h) and, when trainable, `weight` are kept for backward. This is the fused linear
    cross-entropy of Liger-Kernel (Hsu et al. 2024, arXiv 2410.10989), which ships only for GPUs.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, softcap, chunk):
        out = head_pass(hidden, weight, targets, softcap, chunk, grad_hidden=True, grad_weight=ctx.needs_input_grad[1])
        ctx.save_for_backward(out.grad_hidden, out.grad_weight)
        ctx.weight_dtype = weight.dtype
        return out.nll_sum

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        grad_w = None
        if grad_weight is not None:  # scaled in fp32 and written in the weight's dtype, with no fp32 copy between
            grad_w = torch.mul(grad_weight, grad_loss, out=torch.empty_like(grad_weight, dtype=ctx.weight_dtype))
        return grad_hidden * grad_loss.to(grad_hidden.dtype), grad_w, None, None, None


class LinearTokenLogProbs(torch.autograd.Function):
    """(log softmax(hidden @ weight.T)[target] per row, the entropy of each row's softmax or an empty tensor), never
    holding more than one chunk of logits.

    d logp / d hidden = -(d nll / d hidden) is formed per row in the forward (as LinearCrossEntropy does for the
    summed loss); backward scales those rows by the incoming per-token gradient. When the head trains (full
    fine-tuning) its gradient needs that per-token factor inside the sum, so backward recomputes the chunks.
    The entropy is a metric: it carries no gradient.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, softcap, chunk, entropy, temperature=1.0):
        out = head_pass(
            hidden,
            weight,
            targets,
            softcap,
            chunk,
            rows=True,
            entropy=entropy,
            grad_hidden=True,
            temperature=temperature,
        )
        ctx.save_for_backward(out.grad_hidden, hidden if ctx.needs_input_grad[1] else None, weight, targets)
        ctx.softcap, ctx.chunk, ctx.temperature = softcap, chunk, temperature
        spread = out.entropy if entropy else out.logps.new_empty(0)
        ctx.mark_non_differentiable(spread)
        return out.logps, spread

    @staticmethod
    def backward(ctx, grad_logps, _grad_entropy):
        grad_hidden, hidden, weight, targets = ctx.saved_tensors
        scale = grad_logps.neg()  # logp = -nll: the saved rows are d nll / d hidden
        grad_w = None
        if hidden is not None:
            again = head_pass(
                hidden,
                weight,
                targets,
                ctx.softcap,
                ctx.chunk,
                grad_weight=True,
                scale=scale,
                temperature=ctx.temperature,
            )
            grad_w = again.grad_weight.to(weight.dtype)
        return grad_hidden * scale.to(grad_hidden.dtype)[:, None], grad_w, None, None, None, None, None


def gather_targets(hidden: torch.Tensor, loss_index: torch.Tensor) -> torch.Tensor:
    """The hidden states at `loss_index` (flat indices into hidden's B·T), in autocast's dtype when autocast is on:
    the head then runs with autocast off, casting by hand."""
    selected = hidden.reshape(-1, hidden.shape[-1]).index_select(0, loss_index)
    device_type = selected.device.type
    if torch.is_autocast_enabled(device_type):
        selected = selected.to(torch.get_autocast_dtype(device_type))
    return selected


def token_loss_sum(hidden, weight, loss_index, loss_targets, softcap=None, chunk: int = LOGIT_CHUNK) -> torch.Tensor:
    """Sum of cross-entropy over the positions in `loss_index` (flat indices into hidden's B·T). Without
    gradients (evaluation) the same chunks and arithmetic, without the gradient's second matmul per chunk."""
    selected = gather_targets(hidden, loss_index)
    with torch.autocast(selected.device.type, enabled=False):
        if not torch.is_grad_enabled():
            return head_pass(selected, weight, loss_targets, softcap, chunk).nll_sum
        return LinearCrossEntropy.apply(selected, weight, loss_targets, softcap, chunk)


class TokenScores(NamedTuple):
    logps: torch.Tensor  # fp32 (K,): each target's log-probability, with its gradient when gradients are on
    entropy: torch.Tensor | None  # fp32 (K,): each position's entropy, without a gradient; None unless asked for


def score_tokens(
    hidden,
    weight,
    loss_index,
    loss_targets,
    softcap=None,
    chunk: int = LOGIT_CHUNK,
    entropy: bool = False,
    temperature: float = 1.0,
) -> TokenScores:
    """The log-probability of each target at the positions `loss_index` (flat indices into hidden's B·T) and, with
    `entropy`, how spread each of those positions' distributions is, from one pass of the head: sequence scores of
    the preference objectives, and per-token scores of sampled completions (at the `temperature` they were
    sampled at, as TRL's GRPO scores them). Without gradients (a reference model) no gradient matmul runs."""
    selected = gather_targets(hidden, loss_index)
    with torch.autocast(selected.device.type, enabled=False):
        if not torch.is_grad_enabled():
            out = head_pass(
                selected, weight, loss_targets, softcap, chunk, rows=True, entropy=entropy, temperature=temperature
            )
            return TokenScores(out.logps, out.entropy)
        logps, spread = LinearTokenLogProbs.apply(selected, weight, loss_targets, softcap, chunk, entropy, temperature)
        return TokenScores(logps, spread if entropy else None)


class CausalLMLoss(torch.nn.Module):
    """Wraps a (peft-wrapped) causal LM; forward returns the summed loss, so DDP/autocast wrap it as usual."""

    @classmethod
    def build(cls, model: torch.nn.Module, objective, trains_base: bool = False) -> CausalLMLoss:
        """The loss module for `objective` (config.ObjectiveConfig; objectives.Objective.loss_module names the class)."""
        return cls(model)

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
        hidden = self.hidden_states(input_ids, position_ids, layout)
        head = self.model.get_output_embeddings()
        return token_loss_sum(hidden, head.weight, loss_index, loss_targets, self.softcap)

    def hidden_states(self, input_ids, position_ids, layout: SeqLayout | None, model=None) -> torch.Tensor:
        """The decoder's last hidden states of `model` (a reference model; the wrapped one when None), with the
        tensors this model's attention path reads beside the positions."""
        model = self.model if model is None else model
        if self.flex_attention and position_ids is not None:
            extra = attention.flex_tensors(position_ids, self.windows)
        elif self.packed_attention and layout is not None:
            extra = attention.layout_tensors(layout, input_ids.device)
        else:
            extra = {}
        out = model.get_decoder()(input_ids=input_ids, position_ids=position_ids, use_cache=False, **extra)
        return out.last_hidden_state
