"""Attention for padding-free packed rows without a block-diagonal mask.

transformers turns restarted `position_ids` into a (T x T) block-diagonal mask for SDPA. That costs the
full T² attention per row although each token only sees its own sequence, and a masked SDPA takes the
slow kernel path. For short examples packed into long rows (arithmetic: ~45 tokens in 256-wide rows)
most of that work is wasted.

Here each packed sequence is gathered into its own slot of a (S, L) layout (L = longest sequence in the
batch), causal attention runs there with no mask (on CPU for short slots as explicit products,
`_SlotAttention`; otherwise SDPA with `is_causal=True`, its fast path), and the output is gathered back.
Slots are right-padded: under a causal mask no real token can see the padding after it, so the padding
needs no mask either. The indices both ways come from the host (`SeqLayout`, built in collate), so
there is no device->host sync. This is flash-attention's varlen idea, expressed with SDPA so it runs on
CPU and on any GPU; when flash-attn is installed on CUDA, transformers' own varlen path is used instead.

On CUDA the slot length changes from batch to batch, which makes cuDNN plan its kernels again and
compiled blocks compile again. There the default is FlexAttention over the packed rows themselves (`FLEX_NAME`):
shapes are [micro_batch, heads, seq_len, head_dim] for the whole run, and a document-causal BlockMask,
built on the device once per micro-batch from the restarted position_ids, skips the blocks that cross
documents, which on an H100 was faster than causal SDPA over whole rows or a dense block-diagonal mask
(benchmarks/design-decisions_cpu_2026-11-22.md#flexattention-over-packed-rows-on-cuda).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from .. import families
from ..data.packing import SeqLayout
from ..device import compute_dtype, to_device
from ..errors import TunelabError
from ..runtime import slot_products

NAME = "tunelab_packed"
FLEX_NAME = "tunelab_flex"
ROWS_NAME = "tunelab_rows"  # whole right-padded rows without a mask: GRPO's rollouts (rows_attention)


def packed_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling=None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
):
    """Attention-interface function: (B, H, T, D) in, (B, T, H, D) out, like transformers' sdpa_attention_forward.

    `sliding_window` (Mistral, Qwen2/3, Phi-3, Gemma-2/3 on their local layers) and `softcap` (Gemma-2's
    attention logit soft-capping) come from the attention module, as transformers passes them to every
    attention implementation: query q sees key k iff q - k < sliding_window, and scores become
    softcap * tanh(scores / softcap) before the softmax, as transformers' eager path computes them. `s_aux`
    (gpt-oss's per-head attention sinks) is one more logit per query row in the softmax, whose probability
    attends to nothing (transformers' gpt-oss eager_attention_forward)."""
    slots = kwargs.get("seq_slots")
    sinks = kwargs.get("s_aux")
    dropout = dropout if module.training else 0.0
    if slots is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        positions = kwargs.get("position_ids")
        t = query.shape[2]
        whole = attention_mask is None and key.shape[2] == t  # the forward of whole rows, no cache
        if whole and positions is not None and t > 1:
            # Packed rows without a layout (the layout would cost more than the dense mask): block-diagonal
            # causal mask from restarted positions, as transformers would build it.
            seq = (positions == 0).cumsum(-1)
            attention_mask = (seq[:, None, :, None] == seq[:, None, None, :]) & _causal(t, sliding_window, query.device)
        plain = softcap is None and sinks is None
        if plain and (sliding_window is None or attention_mask is not None and whole):
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling)
        if not whole or (t > 1 and positions is None):
            raise TunelabError(
                "attention: sliding windows, logit soft-capping and attention sinks are applied to whole rows with "
                "position_ids (no cache, no mask); load the model with attn_implementation='eager' to generate"
            )
        if attention_mask is None:
            attention_mask = _causal(t, sliding_window, query.device)  # one unpacked row per batch row
        out = _masked_attention(query, key, value, attention_mask, scaling, softcap, dropout, sinks)
        return out.transpose(1, 2).contiguous(), None
    b, h, t, d = query.shape
    slot_tokens, slot_valid, token_slot, token_in_slot = slots
    s, length = slot_tokens.shape
    if sliding_window is not None and sliding_window >= length:
        sliding_window = None  # no slot is longer than the window: plain causal attention

    def to_slots(x):  # (B, Hx, T, D) -> (S, Hx, L, D)
        tokens = x.transpose(1, 2).reshape(b * t, x.shape[1], d)
        gathered = _Regather.apply(tokens, slot_tokens.view(-1), slot_valid.view(-1), token_slot, token_in_slot)
        return gathered.view(s, length, x.shape[1], d).transpose(1, 2)

    q, k, v = to_slots(query), to_slots(key), to_slots(value)
    if softcap is not None or sinks is not None:
        out = _masked_attention(q, k, v, _causal(length, sliding_window, q.device), scaling, softcap, dropout, sinks)
    elif _products(q, length, dropout):
        out = _SlotAttention.apply(q, k, v, scaling if scaling is not None else d**-0.5, sliding_window)
    elif sliding_window is not None:
        mask = _causal(length, sliding_window, q.device)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scaling, dropout_p=dropout, enable_gqa=k.shape[1] != h
        )
    else:
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scaling, dropout_p=dropout, enable_gqa=k.shape[1] != h
        )
    out = out.transpose(1, 2).reshape(s * length, h, d)
    result = _Regather.apply(out, token_slot, token_in_slot, slot_tokens.view(-1), slot_valid.view(-1))
    return result.view(b, t, h, d), None


def _products(q: torch.Tensor, length: int, dropout: float) -> bool:
    """Whether this call's slots of `length` run as explicit products (runtime.slot_products): inside a compiled
    block (traced by dynamo, so the choice is part of the graph) or eager, in 16-bit products or fp32."""
    half = compute_dtype(q) != torch.float32
    return slot_products(q.device.type, length, dropout, torch.compiler.is_compiling(), half)


def _causal(length: int, window: int | None, device) -> torch.Tensor:
    """(L, L) boolean: query i sees key j iff j <= i and, under a sliding window, i - j < window."""
    index = torch.arange(length, device=device)
    offset = index[:, None] - index[None, :]
    mask = offset >= 0
    return mask & (offset < window) if window is not None else mask


def _masked_attention(
    query, key, value, mask, scaling, softcap, dropout: float = 0.0, sinks: torch.Tensor | None = None
) -> torch.Tensor:
    """(B, H, T, D) attention under a boolean mask broadcastable to (B, H, T, T). SDPA where it can; explicit
    products (autograd's gradient) under logit soft-capping or attention sinks, which SDPA has no hook for, in
    transformers' eager order: scale, cap, mask, the sinks' column (H,) appended, fp32 softmax, that column
    dropped."""
    heads, kv_heads = query.shape[1], key.shape[1]
    if softcap is None and sinks is None:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scaling, dropout_p=dropout, enable_gqa=kv_heads != heads
        )
    if kv_heads != heads:
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = (query @ key.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        column = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1, dtype=torch.float32)[..., :-1]
        probs = probs.to(value.dtype)
    else:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    probs = F.dropout(probs, p=dropout, training=dropout > 0)
    return probs @ value


class _Regather(torch.autograd.Function):
    """`out[i] = x[index[i]]` where `keep[i]`, else 0, for a one-to-one map between the kept rows of both
    sides (tokens <-> attention slots). Its gradient is then the same gather with the inverse map, not the
    scatter-add that autograd derives for `index_select`: on CPU inductor compiles a gather into the
    neighbouring kernels but calls aten for scatter-adds (each with a zero-filled buffer), so the gather made
    attention faster than index_select / index_copy
    (benchmarks/design-decisions_cpu_2026-11-22.md#gather-gradient-for-the-slot-regather)."""

    @staticmethod
    def forward(ctx, x, index, keep, inverse, inverse_keep):
        ctx.save_for_backward(inverse, inverse_keep)
        return torch.where(keep[:, None, None], x[index], 0)

    @staticmethod
    def backward(ctx, grad):
        inverse, inverse_keep = ctx.saved_tensors
        return torch.where(inverse_keep[:, None, None], grad[inverse], 0), None, None, None, None


class _SlotAttention(torch.autograd.Function):
    """Causal attention over short slots as explicit products, with flash-attention's softmax gradient.

    Why: with autograd's softmax, inductor's backward kernel recomputed the masked softmax from the saved
    scores (max, exp, sum over L) before its gradient reduction over L. Here the forward reduces the scores
    to a log-sum-exp and writes the probabilities once, in bf16 (the product with V reads them anyway), and
    the backward is dS = P * (dP - rowsum(P * dP)), nothing recomputed. The correction term is taken from
    the bf16-rounded dP it is subtracted from, not from flash-attention's rowsum(dO * O) (equal in exact
    arithmetic): the rounding errors of dP then cancel, a row with one key gets exactly zero gradient, and the
    output need not be kept. It cut the bf16 dq and dk errors against an fp32 reference, for one L-wide
    reduction instead of a D-wide one (benchmarks/attention/slot-attention-correction_epyc-avx512bf16-2c_2026-11-25.md).

    Grouped-query heads are folded instead of copying K and V per query head: query heads kv*G..kv*G+G-1
    share KV head kv (transformers' repeat_kv), so (S, H, L, D) viewed as (S, KV, G*L, D) multiplies each
    KV head once.

    On the quickstart's slots this made the products and both kernels faster, with the same error against an
    fp32 reference (benchmarks/design-decisions_cpu_2026-11-22.md#slot-attention-as-one-autograd-function).

    For slots longer than runtime.SLOT_MAX_LEN (measured: per compiled or eager block, 16-bit or fp32), SDPA's
    flash kernel is used, whose memory does not grow as L²; so it is with attention dropout, which this product
    does not apply."""

    @staticmethod
    def forward(ctx, q, k, v, scale: float, window: int | None = None):
        s, h, length, d = q.shape
        groups = h // k.shape[1]
        dtype = compute_dtype(q)  # under autocast q may be fp32 (RoPE in fp32) while the products are bf16
        q, k, v = q.reshape(s, k.shape[1], groups * length, d).to(dtype), k.to(dtype), v.to(dtype)
        future = (~_causal(length, window, q.device)).repeat(groups, 1)
        with torch.autocast(q.device.type, enabled=False):
            scores = ((q @ k.transpose(-1, -2)).float() * scale).masked_fill(future, float("-inf"))
            probs = torch.exp(scores - torch.logsumexp(scores, -1, keepdim=True)).to(dtype)
            out = probs @ v
        ctx.save_for_backward(q, k, v, probs)
        ctx.scale, ctx.shape = scale, (s, h, length, d)
        return out.view(s, h, length, d)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, probs = ctx.saved_tensors
        grad_out = grad_out.reshape(q.shape).to(q.dtype)
        grad_v = probs.transpose(-1, -2) @ grad_out
        grad_probs = grad_out @ v.transpose(-1, -2)
        probs32, grad_probs32 = probs.float(), grad_probs.float()
        correction = (probs32 * grad_probs32).sum(-1, keepdim=True)
        grad_scores = (probs32 * (grad_probs32 - correction) * ctx.scale).to(q.dtype)
        grad_q = grad_scores @ k
        grad_k = grad_scores.transpose(-1, -2) @ q
        return grad_q.view(ctx.shape), grad_k, grad_v, None, None


def rows_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling=None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
):
    """Attention-interface function for whole right-padded rows without a mask (GRPO's rollouts: prompt then
    completion, where under the causal mask no real token sees the padding after it): each row is one causal slot,
    run as `_SlotAttention`'s explicit products where SFT's slots of that length would be (short, on a CPU, no
    dropout), else transformers' SDPA. On the AVX-512 BF16 EPYC a GRPO micro-batch's attention (16 rows of 62
    tokens) took 0.37x flash's forward and backward time
    (benchmarks/grpo/grpo-bf16-peer_epyc-avx512bf16-2c_2026-12-07.md); the products are SFT's, whose bf16 error
    against an fp32 reference was flash's or lower. With a mask or a cache (sampling), SDPA."""
    length = query.shape[2]
    dropout = dropout if module.training else 0.0
    whole = attention_mask is None and key.shape[2] == length
    sinks = kwargs.get("s_aux")
    if sinks is not None:  # gpt-oss: SDPA would drop the sinks (transformers passes s_aux through **kwargs)
        mask = attention_mask if attention_mask is not None else _causal(length, sliding_window, query.device)
        if key.shape[2] != length or mask.dtype != torch.bool:
            raise TunelabError("attention: attention sinks over a cache run on attn_implementation='eager'")
        out = _masked_attention(query, key, value, mask, scaling, softcap, dropout, sinks)
        return out.transpose(1, 2).contiguous(), None
    plain = softcap is None and (sliding_window is None or sliding_window >= length)
    if whole and plain and _products(query, length, dropout):
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        return _SlotAttention.apply(query, key, value, scale, None).transpose(1, 2).contiguous(), None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        sliding_window=sliding_window,
        softcap=softcap,
        **kwargs,
    )


def register_rows() -> str:
    """Make `attn_implementation=ROWS_NAME` (rows_attention) available to transformers models; returns it. With
    SDPA's mask function: for plain causal rows it builds no mask (rows_attention's products run), while a
    sliding window longer rows reach gets its mask (and SDPA). Sampling runs on SDPA (`with_padding_masks`)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ROWS_NAME, rows_attention)
    AttentionMaskInterface.register(ROWS_NAME, sdpa_mask)
    return ROWS_NAME


def register(path: str = "slots") -> str:
    """Make `attn_implementation=NAME` (slots) and `FLEX_NAME` available to transformers models; returns the
    name for `path` (slots | flex).

    Neither name gets a mask function (AttentionMaskInterface): for an implementation without one, transformers
    returns no mask at once. With one, it first scans `position_ids` for packed sequences, a `.all()` read
    back to the host on every forward (a device sync per micro-batch on a GPU), to build a mask these paths
    never read.
    """
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, packed_attention)
    AttentionInterface.register(FLEX_NAME, flex_packed_attention)
    return FLEX_NAME if path == "flex" else NAME


def layout_tensors(layout: SeqLayout, device: torch.device) -> dict[str, tuple[torch.Tensor, ...]]:
    """The kwarg `packed_attention` reads: the layout's maps both ways, moved to the device."""
    arrays = (layout.gather, layout.valid, layout.slot, layout.in_slot)
    return {"seq_slots": tuple(to_device(a, device) for a in arrays)}


def document_block_mask(position_ids: torch.Tensor, window: int | None = None):
    """The document-causal BlockMask of packed rows, built on their device: token q sees token kv iff both
    are in the same document and kv <= q (and, with a sliding `window`, q - kv < window). Documents are
    numbered by counting position restarts (position_ids == 0) along the row; a row's padded tail restarts
    its positions too (data/packing.collate), so it is a document of its own that no real token sees. Tensor
    ops only: nothing is read back to the host. Every layer of the forward reuses the mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    document = (position_ids == 0).cumsum(-1)

    def document_causal(b, h, q_idx, kv_idx):
        return (document[b, q_idx] == document[b, kv_idx]) & (q_idx >= kv_idx)

    def document_window(b, h, q_idx, kv_idx):
        return document_causal(b, h, q_idx, kv_idx) & (q_idx - kv_idx < window)

    rows, width = position_ids.shape
    if window is not None:
        return create_block_mask(document_window, rows, None, width, width, device=position_ids.device)
    return _document_causal_blocks(document, document_causal)


BLOCK = 128  # FlexAttention's default block, both ways


def _document_causal_blocks(document: torch.Tensor, mask_mod):
    """The document-causal BlockMask from each block's first and last document number, never the (T x T)
    element mask that create_block_mask evaluates (B x T² booleans: 17 GB at T = 131,072). Documents are
    numbered in order along a row, so a kv block j below q block i shares a document with it iff j's last
    document is i's first, and is full (no element masked) iff both blocks lie in that one document; the
    diagonal block is always partial. O((T/128)²) block flags per row."""
    from torch.nn.attention.flex_attention import BlockMask

    rows, width = document.shape
    blocks = -(-width // BLOCK)
    tail = blocks * BLOCK - width  # a partial last block: its missing positions repeat the row's last document
    padded = torch.cat([document, document[:, -1:].expand(rows, tail)], dim=1) if tail else document
    per_block = padded.view(rows, blocks, BLOCK)
    first, last = per_block[:, :, 0], per_block[:, :, -1]
    index = torch.arange(blocks, device=document.device)
    below = index[None, :] < index[:, None]  # [i, j]: kv block j strictly below q block i
    shared = below & (last[:, None, :] == first[:, :, None])
    one_document = first == last
    full = shared & one_document[:, None, :] & one_document[:, :, None]
    partial = (shared & ~full) | (index[None, :] == index[:, None])

    def ordered(flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        counts = flags.sum(-1, dtype=torch.int32)[:, None]
        order = torch.argsort(flags.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
        return counts, order[:, None]

    kv_num, kv_index = ordered(partial)
    full_num, full_index = ordered(full)
    return BlockMask.from_kv_blocks(kv_num, kv_index, full_num, full_index, BLOCK, mask_mod, (width, width))


def flex_tensors(position_ids: torch.Tensor, windows=()) -> dict:
    """The kwargs `flex_packed_attention` reads: one micro-batch's document-causal BlockMask, and one per
    sliding-window width the model's layers use (families.sliding_windows)."""
    return {
        "flex_block_mask": document_block_mask(position_ids),
        "flex_window_masks": {w: document_block_mask(position_ids, w) for w in windows},
    }


_compiled_flex = None
_softcaps: dict[float, object] = {}


def _flex_attention():
    """flex_attention through torch.compile, created once: uncompiled, it materializes the full score
    matrix; compiled, it is one fused kernel that skips masked blocks."""
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention

        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex


def _softcap_score(softcap: float):
    """The score_mod of attention logit soft-capping, one function per cap so compiled kernels are reused."""
    if softcap not in _softcaps:

        def capped(score, b, h, q_idx, kv_idx):
            return torch.tanh(score / softcap) * softcap

        _softcaps[softcap] = capped
    return _softcaps[softcap]


def flex_packed_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling=None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
):
    """Attention-interface function over whole packed rows with the micro-batch's document-causal BlockMask
    (`flex_tensors`): (B, H, T, D) in, (B, T, H, D) out; a sliding-window layer takes the BlockMask of its
    width, soft-capping is a score_mod, attention sinks renormalise by the log-sum-exp (`with_sinks`). Without a
    BlockMask (unpacked rows, generation) it is `packed_attention` without slots."""
    block_mask = kwargs.get("flex_block_mask")
    sinks = kwargs.get("s_aux")
    if block_mask is None:
        return packed_attention(
            module, query, key, value, attention_mask, dropout, scaling, sliding_window, softcap, **kwargs
        )
    if sliding_window is not None:
        block_mask = kwargs.get("flex_window_masks", {}).get(sliding_window)
        if block_mask is None:
            raise TunelabError(f"attention: no BlockMask for this layer's sliding window of {sliding_window} tokens")
    if dropout and module.training:
        raise TunelabError("attention: flex has no attention dropout; set attention=slots for this model")
    dtype = compute_dtype(query)  # under autocast RoPE may leave q and k in fp32 while v is bf16
    q, k, v = query.to(dtype), key.to(dtype), value.to(dtype)
    gqa = k.shape[1] != q.shape[1]
    if q.device.type == "cpu" and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        # FlexAttention has no backward on CPU (torch 2.13); the same mask_mod, expanded densely, feeds SDPA
        # (or explicit products under soft-capping).
        from torch.nn.attention.flex_attention import create_mask

        b, _, t, _ = q.shape
        mask = create_mask(block_mask.mask_mod, b, 1, t, t, device=q.device)
        out = _masked_attention(q, k, v, mask, scaling, softcap, sinks=sinks)
    else:
        score_mod = None if softcap is None else _softcap_score(softcap)
        flex = _flex_attention()
        if sinks is None:
            out = flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scaling, enable_gqa=gqa)
        else:
            from torch.nn.attention.flex_attention import AuxRequest

            out, aux = flex(
                q,
                k,
                v,
                score_mod=score_mod,
                block_mask=block_mask,
                scale=scaling,
                enable_gqa=gqa,
                return_aux=AuxRequest(lse=True),
            )
            out = with_sinks(out, aux.lse, sinks)
    return out.transpose(1, 2).contiguous(), None


def with_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Attention output (B, H, T, D) over the keys, with its log-sum-exp (B, H, T), renormalised as if each
    head's sink logit had been one more column of the softmax: exp(lse) / (exp(lse) + exp(sink)) =
    sigmoid(lse - sink) of the probability stays on the keys."""
    keep = torch.sigmoid(lse.float() - sinks.float().view(1, -1, 1))
    return (out.float() * keep.unsqueeze(-1)).to(out.dtype)


@contextmanager
def with_padding_masks(model: torch.nn.Module) -> Iterator[None]:
    """`model` on transformers' SDPA while inside, where it runs on one of tunelab's packed-row paths (NAME,
    FLEX_NAME): those get no mask function (`register`), so over left-padded prompts with a KV cache, as sampling
    runs, the padding would be attended to; SDPA takes transformers' padding mask. The attention modules read the
    implementation from the config they share at every forward."""
    config = model.config
    chosen = config._attn_implementation
    if chosen in (NAME, FLEX_NAME, ROWS_NAME):
        config._attn_implementation = "eager" if families.eager_only(config) else "sdpa"
    try:
        yield
    finally:
        config._attn_implementation = chosen
