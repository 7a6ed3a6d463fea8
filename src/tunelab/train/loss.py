"""The model as one module that returns the summed token loss, with the LM head applied only where needed, and the
chunked head every objective scores tokens with.

Why not `model(input_ids, labels=...)`: that computes logits for every position (B·T·V, 49k vocab here)
and upcasts them all to fp32 for the loss. With prompt masking most positions have no target. We gather
the hidden states at the target positions first (indices computed on the host: no sync), then run the
head and the cross-entropy fused and in chunks, so at most one chunk of fp32 logits exists at a time.
On a CPU one fp32 log_softmax over a step's logits took longer than the model's own matmuls for that step
(benchmarks/design-decisions_cpu_2026-11-22.md#fused-chunked-head-and-loss).

`head_pass` is that chunk loop, written once: each target's negative log-probability, optionally its distribution's
entropy and log-sum-exp, and the gradient of the negative log-probabilities with respect to the hidden states.
`head_weight_grad` is the head's own gradient, made in backward one vocabulary slice at a time straight into a
tensor of the weight's dtype, so no fp32 sum the size of the head waits from forward to backward.
`token_loss_sum` (supervised cross-entropy) and `score_tokens` (per-token log-probabilities and entropies: the
preference objectives, and any objective that scores sampled tokens) are its two public faces.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .. import families
from ..data.packing import SeqLayout
from ..errors import TunelabError
from ..model import attention, moe
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
    lse: torch.Tensor | None = None  # fp32 (K,): each row's log Σ exp(logits), what head_weight_grad recomputes from
    grad_hidden: torch.Tensor | None = None  # (K, h), hidden's dtype: row i is d nll_i / d hidden_i


def head_pass(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    softcap: float | None,
    chunk: int,
    *,
    rows: bool = False,
    entropy: bool = False,
    lse: bool = False,
    grad_hidden: bool = False,
    temperature: float = 1.0,
) -> HeadPass:
    """The head `hidden @ weight.T` over `hidden`'s rows (already gathered at the targets), `chunk` rows at a time.

    Logits are computed in the compute dtype and upcast to fp32 for the softmax, as autocast would. Each chunk's
    gradient with respect to its logits (softmax - onehot, through the soft cap's tanh) is formed here, while the
    logits exist, so no caller keeps them for backward: `grad_hidden` asks for its product with the head. The head's
    own gradient is head_weight_grad's, made in backward from the `lse` this pass keeps. `temperature` divides the
    (soft-capped) logits, as a sampler at that temperature does: the log-probs of the distribution sampled from.
    """
    w = weight.to(hidden.dtype)
    k = hidden.shape[0]
    f32 = {"dtype": torch.float32, "device": hidden.device}
    out = HeadPass(
        nll_sum=torch.zeros((), **f32),
        logps=torch.empty(k, **f32) if rows else None,
        entropy=torch.empty(k, **f32) if entropy else None,
        lse=torch.empty(k, **f32) if lse else None,
        grad_hidden=torch.empty_like(hidden) if grad_hidden else None,
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
        if lse:
            out.lse[start : start + n] = top + log_total
        if grad_hidden:
            grad = probs.div_(total)
            grad[index, t] -= 1.0
            grad = low[:n].copy_(_logit_grad_factors(grad, squash, softcap, temperature))
            torch.mm(grad, w, out=out.grad_hidden[start : start + n])
    return out


def _logit_grad_factors(grad, squash, softcap, temperature):
    """d nll / d (final logit) -> d nll / d (raw logit): through the soft cap's tanh and the temperature, in place."""
    if softcap:
        grad.mul_(1.0 - squash.square())
    if temperature != 1.0:
        grad.div_(temperature)
    return grad


def head_weight_grad(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    softcap: float | None,
    chunk: int,
    scale: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """d (Σ_i scale_i · nll_i) / d weight, in the weight's dtype, from `lse` (head_pass's, the same logits).

    The vocabulary is cut into slices of rows of `weight`; each slice's logits over all K rows are recomputed (one
    more head matmul than a forward that forms the gradient while its logits exist), turned into the softmax from
    `lse`, and multiplied by the hidden states in one matmul whose sum over the K rows accumulates in fp32 inside the
    matmul and is rounded once, into that slice of the result. So the head's gradient never exists in fp32 as a
    whole: at the peak it costs the weight's bytes, not 4 more (docs/formulas.md, the loss's memory). A slice's
    logits are no larger than a forward chunk's and live in the same scratch buffers. `scale` (fp32, () or (K,))
    is the incoming gradient: the loss's scalar or each row's factor.
    """
    k, vocab = hidden.shape[0], weight.shape[0]
    out = torch.empty_like(weight)
    if k == 0:
        return out.zero_()
    cols = max(1, min(vocab, chunk * vocab // k))  # k x cols <= chunk x vocab: the scratch buffers hold a slice
    held = max(chunk, -(-k * cols // vocab))  # more rows only when k exceeds chunk x vocab (a tiny vocabulary)
    low = _scratch("low", (held, vocab), hidden.dtype, hidden.device).view(-1)
    full = _scratch("full", (held, vocab), torch.float32, hidden.device).view(-1)
    rows = torch.arange(k, device=hidden.device)
    scale = (scale if scale.dim() == 0 else scale[:, None]).to(torch.float32)
    lse = lse[:, None]
    for start in range(0, vocab, cols):
        n = min(cols, vocab - start)
        logits, squash = _chunk_logits(
            hidden,
            weight[start : start + n].to(hidden.dtype),  # the slice cast, not the whole head
            low[: k * n].view(k, n),
            full[: k * n].view(k, n),
            softcap,
            temperature,
        )
        grad = logits.sub_(lse).exp_()
        # -1 at each row's target when it falls in this slice, without a host sync: 0 elsewhere
        local = targets - start
        hit = ((local >= 0) & (local < n)).to(torch.float32)
        grad.index_put_((rows, local.clamp(0, n - 1)), -hit, accumulate=True)
        grad = low[: k * n].view(k, n).copy_(_logit_grad_factors(grad, squash, softcap, temperature).mul_(scale))
        if out.dtype == grad.dtype:
            torch.mm(grad.T, hidden, out=out[start : start + n])
        else:  # fp32 master weights under a bf16 compute dtype: the slice's product, then its widening
            out[start : start + n].copy_(grad.T @ hidden)
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
    the logits (softmax - onehot) are both computed there, and only the small gradient with respect to
    `hidden` (K x h) is kept for backward. This is the fused linear cross-entropy of Liger-Kernel (Hsu et al.
    2024, arXiv 2410.10989), which ships only for GPUs. When the head trains (full fine-tuning), the forward also
    keeps the rows, the targets and each row's log-sum-exp (K x h and 2 K values), and backward makes the head's
    gradient from them (head_weight_grad) instead of the forward holding its fp32 sum until then.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, softcap, chunk):
        trains_head = ctx.needs_input_grad[1]
        out = head_pass(hidden, weight, targets, softcap, chunk, lse=trains_head, grad_hidden=True)
        kept = (hidden, weight, targets, out.lse) if trains_head else (None, None, None, None)
        ctx.save_for_backward(out.grad_hidden, *kept)
        ctx.softcap, ctx.chunk = softcap, chunk
        return out.nll_sum

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, hidden, weight, targets, lse = ctx.saved_tensors
        grad_w = None
        if hidden is not None:
            grad_w = head_weight_grad(hidden, weight, targets, lse, ctx.softcap, ctx.chunk, grad_loss)
        return grad_hidden * grad_loss.to(grad_hidden.dtype), grad_w, None, None, None


class LinearTokenLogProbs(torch.autograd.Function):
    """(log softmax(hidden @ weight.T)[target] per row, the entropy of each row's softmax or an empty tensor), never
    holding more than one chunk of logits.

    d logp / d hidden = -(d nll / d hidden) is formed per row in the forward (as LinearCrossEntropy does for the
    summed loss); backward scales those rows by the incoming per-token gradient. When the head trains (full
    fine-tuning) its gradient needs that per-token factor inside the sum, so backward makes it from the saved
    log-sum-exps (head_weight_grad).
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
            lse=ctx.needs_input_grad[1],
            grad_hidden=True,
            temperature=temperature,
        )
        ctx.save_for_backward(out.grad_hidden, hidden if ctx.needs_input_grad[1] else None, weight, targets, out.lse)
        ctx.softcap, ctx.chunk, ctx.temperature = softcap, chunk, temperature
        spread = out.entropy if entropy else out.logps.new_empty(0)
        ctx.mark_non_differentiable(spread)
        return out.logps, spread

    @staticmethod
    def backward(ctx, grad_logps, _grad_entropy):
        grad_hidden, hidden, weight, targets, lse = ctx.saved_tensors
        scale = grad_logps.neg()  # logp = -nll: the saved rows are d nll / d hidden
        grad_w = None
        if hidden is not None:
            grad_w = head_weight_grad(hidden, weight, targets, lse, ctx.softcap, ctx.chunk, scale, ctx.temperature)
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
        # Mixture-of-Experts: the router's load-balancing loss (model/moe.py), kept apart for the metrics.
        self.router = moe.RouterLoss(model) if moe.is_moe(config) else None
        self._router_logits = self._router_mask = None
        self._aux_sum = torch.zeros((), dtype=torch.float64)
        self._aux_count = 0
        # The reference's frozen copy (keep_reference), held in a list outside the module tree: not trained, saved
        # or sharded.
        self.frozen: list[torch.nn.Module] = []

    def keep_reference(self, trains_base: bool) -> None:
        """Ready the reference model an objective compares the policy with (DPO's, GRPO's KL term), as the
        method's row says (methods.Method.reference): an adapter's is its base with the adapter disabled, no second
        copy of the weights; full fine-tuning keeps a frozen copy of the starting weights."""
        self.frozen = [frozen_copy(self.model)] if trains_base else []

    @contextmanager
    def reference_model(self):
        """The reference model to run: the frozen copy, else this model with its adapter disabled."""
        if self.frozen:
            yield self.frozen[0]
            return
        with self.model.disable_adapter() if hasattr(self.model, "disable_adapter") else nullcontext():
            yield self.model

    def forward(
        self, input_ids, position_ids, loss_index, loss_targets, layout: SeqLayout | None = None
    ) -> torch.Tensor:
        hidden = self.hidden_states(input_ids, position_ids, layout)
        head = self.model.get_output_embeddings()
        loss = token_loss_sum(hidden, head.weight, loss_index, loss_targets, self.softcap)
        if self.router is not None:
            loss = loss + self.router_term(loss_index.numel())
        return loss

    def router_term(self, units: float) -> torch.Tensor:
        """The router's load-balancing loss of the policy's last forward, weighted as `units` of what the objective's
        step loss is a mean over (objectives.Objective.mean_over): the micro-batch's target tokens (SFT), its pairs
        (DPO, ORPO), or 1 / the step's micro-batches (GRPO, whose micro-batch loss is already its share). Divided
        by the step's units it is router_aux_loss_coef x the loss, the term transformers (SFT) and TRL (DPO, ORPO,
        GRPO) add to the mean; 0 unless the config's output_router_logits asks for it. The loss itself is logged
        apart (window_metrics)."""
        aux = self.router(self._router_logits, self._router_mask)
        self._router_logits = self._router_mask = None
        if torch.is_grad_enabled():
            self._aux_sum = self._aux_sum.to(aux.device) + aux.detach().double()
            self._aux_count += 1
        if not self.router.trains:
            return aux.new_zeros(())
        return aux * (self.router.coef * units)

    def window_metrics(self, accelerator=None) -> dict[str, float]:
        """The mean router load-balancing loss over the micro-batches since the last log line (MoE models). Under
        several processes every one reduces, those that ran no forward with gradients since (a rank's empty share
        of DPO pairs, GRPO micro-batches without a completion to train) included, or the others would wait."""
        if self.router is None or (accelerator is None and not self._aux_count):
            return {}
        total = torch.stack([self._aux_sum, self._aux_sum.new_tensor(float(self._aux_count))])  # on its device
        if accelerator is not None:
            total = accelerator.reduce(total.to(accelerator.device), "sum")
        self._aux_sum, self._aux_count = torch.zeros((), dtype=torch.float64), 0
        if not total[1].item():
            return {}
        return {"router_aux_loss": (total[0] / total[1]).item()}

    def hidden_states(
        self, input_ids, position_ids, layout: SeqLayout | None, model=None, real: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The decoder's last hidden states of `model` (a reference model; the wrapped one when None), with the
        tensors this model's attention path reads beside the positions. The policy's (model None) router logits are
        kept for router_term, over the real tokens: a packed layout's, else `real` (B, T) where given, else all;
        a reference's forward keeps none."""
        if self.flex_attention and position_ids is not None:
            extra = attention.flex_tensors(position_ids, self.windows)
        elif self.packed_attention and layout is not None:
            extra = attention.layout_tensors(layout, input_ids.device)
        else:
            extra = {}
        policy = model is None
        model = self.model if policy else model
        keep = self.router is not None and policy
        if keep:
            extra["output_router_logits"] = True
        out = model.get_decoder()(input_ids=input_ids, position_ids=position_ids, use_cache=False, **extra)
        if keep:
            self._router_logits = out.router_logits
            # the real tokens of packed rows (a row's padded tail routes too, but is no token of the batch)
            if layout is not None:
                real = torch.as_tensor(layout.in_slot, device=input_ids.device)
            self._router_mask = None if real is None else real.float()
        return out.last_hidden_state


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` in eval mode whose weights never train: a reference model's starting weights."""
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
