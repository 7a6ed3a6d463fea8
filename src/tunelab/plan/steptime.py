"""A training step's time from its parts (docs/formulas.md#step-time-from-its-parts).

step_s = matmul_s + attention_s + memory_s + fixed_s, each a pure function of the step's shape and the device:
- matmul: every GEMM of the forward and backward by its shape (m x k x n), on a roofline: at or above the
  device's ridge (peak / bandwidth, datasheet figures) a GEMM is compute-bound and runs at `matmul` x peak;
  below it (the LoRA rank-r products, small models' skinny layers) it is memory-bound and moves its operands at
  `bandwidth` x the device's bandwidth. That memory-bound share is the fitted efficiency of small shapes.
- attention: the work the kernel does, counted over the keys each query really attends to (document-causal
  under packing on a GPU, the slots' squares on a CPU's slot path, the whole padded rectangle for padded rows),
  at `attention` x peak; where the kernel writes its scores out (the CPU's explicit products), their
  element-wise passes count as memory-bound work.
- memory-bound work: the bytes norms, rotary, activation functions, residual adds, LoRA's scale-and-add, the
  loss (over the positions with a target), nf4 dequantization, full fine-tuning's weight gradients (the head's
  accumulated chunk by chunk) and the optimizer move, eager or compiled
  (compiled blocks fuse them: fewer bytes), at `bandwidth` x the device's bandwidth.
- fixed: kernel launches x the host's exposed time per launch (`launch_s`); eager launches several times what
  compiled blocks do.
- Mixture-of-Experts: each routed expert is its own GEMM over the tokens routed to it, priced as if every expert
  had the most loaded one's tokens (imbalance x top_k / experts of the micro-batch's, at most all of them): the
  expert part's time is set by the most loaded expert. Few tokens per expert make those GEMMs memory-bound,
  reading every expert's weights. The router's softmax and top-k and the token permutation (gathering top_k
  copies of each token's hidden state, scattering the weighted outputs back) are memory-bound work of their own
  (routing_bytes_per_token).
- Mixture-of-Experts on a CPU (Shape.expert_segments): no grouped kernel runs there, so each expert reached runs
  each projection as a product of its own, one after another (model/moe.Segments): the experts' time is the sum
  of their products, whatever the split of the tokens (the imbalance does not price it: expert_rows), and every
  such product costs `call_s` beyond its FLOPs (expert_product_calls; the device's product-call probe,
  probe.product_call_s). LoRA on the experts runs over the rows laid out in zero-padded tiles: its products over
  the padded rows, and the in-place accumulation, the padding's fills and the factor gathers as memory-bound
  work (tile_bytes).
The four constants (Constants) are the only fitted figures: per device from measured rows (plan/fit.py,
catalog/fitted.yaml), carried over from the other measured devices of the same kind where a device has none;
`call_s` is measured by a probe (catalog/calls.yaml per CPU class, or a row's own probe), never fitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from ..methods import Method
from ..runtime import LOGIT_CHUNK
from .arch import Arch
from .flops import adapter_params


@dataclass(frozen=True)
class Constants:
    matmul: float  # achieved fraction of the peak on compute-bound GEMMs
    attention: float  # achieved fraction of the peak on attention's work
    bandwidth: float  # achieved fraction of the bandwidth on memory-bound work
    launch_s: float  # host seconds exposed per kernel launch

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


@dataclass(frozen=True)
class Shape:
    """One optimizer step as the device sees it."""

    micro_batches: int  # per optimizer step, per GPU
    tokens: int  # fed positions per micro-batch (rows x width, padding included)
    keys_per_token: float  # mean keys a query attends to (attention_keys)
    compiled: bool
    compute_bytes: int  # 2 (bf16/fp16) or 4 (fp32)
    loss_tokens: float  # positions with a target per micro-batch: the head and the loss run over these only
    loss_chunk: int = LOGIT_CHUNK  # rows of logits per chunk of the fused head and loss (train/loss.py)
    # Of keys_per_token, those whose scores attention writes out (the CPU slot path's explicit products): their
    # element-wise passes are memory-bound work per query-key pair (score_bytes_per_pair). 0: fused kernels only.
    scored_keys_per_token: float = 0.0
    # The HF Trainer + PEFT stack's parts (plan/hfstack.py); tunelab's own step leaves them at their defaults.
    whole_logits: bool = False  # the whole-vocabulary logits and their fp32 cross-entropy (loss_bytes_per_token)
    fused_ops: bool = False  # Liger's fused RMSNorm, SwiGLU and RoPE (elementwise_elements_per_token)
    eager_attention: bool = False  # attention as two batched GEMMs and a written-out softmax (eager_score_bytes)
    fused_optimizer: bool = True  # one fused kernel per parameter group (step_bytes); False: foreach AdamW
    # The most loaded expert's tokens over the mean expert's (an MoE model's routing; 1: uniform, the assumption
    # unless a config's moe.imbalance or a measurement says otherwise).
    imbalance: float = 1.0
    # tunelab's CPU experts path (model/moe.Segments): one product per expert reached, one after another (no grouped
    # kernel), and LoRA on them over zero-padded tiles; False: one grouped kernel per projection.
    expert_segments: bool = False


@dataclass(frozen=True)
class Work:
    """What one optimizer step does, split by what bounds each part."""

    matmul_flops: float  # compute-bound GEMMs
    matmul_bytes: float  # memory-bound GEMMs' operands (below the ridge)
    attention_flops: float
    memory_bytes: float  # element-wise, loss, dequantization, optimizer
    launches: float
    calls: float = 0.0  # per-expert product calls (expert_product_calls): call_s each, a probe's, not fitted

    def coefficients(self, peak_flops: float, bandwidth_bps: float) -> tuple[float, float, float, float]:
        """Seconds per unit of 1/matmul, 1/attention, 1/bandwidth and launch_s: step_s is their dot product with
        (1/matmul, 1/attention, 1/bandwidth, launch_s), which is what makes fitting a linear least squares."""
        return (
            self.matmul_flops / peak_flops,
            self.attention_flops / peak_flops,
            (self.matmul_bytes + self.memory_bytes) / bandwidth_bps,
            self.launches,
        )


@dataclass(frozen=True)
class Breakdown:
    matmul_s: float
    attention_s: float
    memory_s: float
    fixed_s: float

    @property
    def total(self) -> float:
        return self.matmul_s + self.attention_s + self.memory_s + self.fixed_s

    def scaled(self, factor: float) -> Breakdown:
        return Breakdown(
            self.matmul_s * factor, self.attention_s * factor, self.memory_s * factor, self.fixed_s * factor
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "matmul_s": self.matmul_s,
            "attention_s": self.attention_s,
            "memory_s": self.memory_s,
            "fixed_s": self.fixed_s,
        }


def attention_keys(lengths: np.ndarray | None, mean_tokens: float, width: int, packing: bool) -> float:
    """Mean keys per query the attention kernel computes. Packed rows are masked per document (flex, slots,
    varlen), so a token at position i of its document attends to i + 1 keys: sum l(l+1)/2 over sum l.
    Padded rows carry a padding mask, which takes SDPA off its causal fast path: every query meets the row's
    whole padded width."""
    if not packing:
        return float(width)
    if lengths is None or len(lengths) == 0:
        lengths = np.array([min(mean_tokens, width)])
    arr = np.minimum(np.asarray(lengths, dtype=np.float64), width)
    return float((arr * (arr + 1) / 2).sum() / arr.sum())


def gemm_shapes(
    arch: Arch,
    method: Method,
    targets: tuple[str, ...],
    r: int,
    tokens: int,
    grad_ckpt: bool,
    loss_tokens: float,
    chunk: int,
    imbalance: float = 1.0,
    expert_segments: bool = False,
) -> list[tuple[int, int, int, int]]:
    """(m, k, n, count) of every GEMM in one micro-batch's forward and backward (flops.py counts the same
    products per token). A weight's forward is m x d_in x d_out; its input gradient m x d_out x d_in; a trained
    weight adds its weight gradient d_in x m x d_out. LoRA's A (d_in x r) and B (r x d_out) are trained:
    three products each. Gradient checkpointing runs the block forwards twice. A routed expert's m is its
    tokens (expert_rows; on tunelab's CPU path, `expert_segments`, every expert at its uniform share: their products
    run one after another, so their sum sets the time; LoRA's over the padded tiles). The head runs over the
    `loss_tokens` positions with a target only (train/loss.py gathers them first); a trained head's backward
    recomputes its logits and makes its weight gradient over all rows, one vocabulary slice at a time (as many
    slices as the forward has chunks of `chunk` rows)."""
    shapes: list[tuple[int, int, int, int]] = []
    fwd = 2 if grad_ckpt else 1
    full = method.trains_base
    for mod in arch.modules():
        d_in, d_out, n = mod.d_in, mod.d_out, mod.count
        routed = mod.share < 1
        m = expert_rows(tokens, mod.share, 1.0 if expert_segments else imbalance)
        shapes.append((m, d_in, d_out, n * fwd))
        shapes.append((m, d_out, d_in, n))
        if full:
            shapes.append((d_in, m, d_out, n))
        elif mod.name in targets:
            t = m + tile_padding(arch, tokens) if routed and expert_segments else m
            shapes += [
                (t, d_in, r, n * fwd),
                (t, r, d_out, n * fwd),
                (r, t, d_out, n),  # B's weight gradient
                (t, d_out, r, n),  # input gradient through B
                (d_in, t, r, n),  # A's weight gradient
                (t, r, d_in, n),  # input gradient through A
            ]
    rows = max(1, round(loss_tokens))
    head = [(rows, arch.hidden, arch.vocab, 1), (rows, arch.vocab, arch.hidden, 1)]
    if full:  # backward recomputes the logits and makes the weight gradient, a vocabulary slice at a time
        slices = head_chunks(loss_tokens, chunk)
        cols = max(1, round(arch.vocab / slices))
        head += [(rows, arch.hidden, cols, slices), (cols, rows, arch.hidden, slices)]
    return shapes + head


def expert_rows(tokens: int, share: float, imbalance: float) -> int:
    """Rows of one module's GEMM in a micro-batch of `tokens`: all of them for a dense module; for a routed expert
    (share top_k / experts), the most loaded expert's, imbalance x its uniform share, never more than every token
    (a token picks an expert once)."""
    if share >= 1:
        return tokens
    return max(1, min(tokens, round(tokens * share * imbalance)))


def experts_hit(experts: int, top_k: int, tokens: float) -> float:
    """Experts that a micro-batch of `tokens` reaches at least once under uniform routing: a token passes an
    expert by with probability 1 - top_k / experts, so E (1 - (1 - k/E)^T)."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def expert_product_calls(arch: Arch, method: Method, grad_ckpt: bool, tokens: float) -> float:
    """Products one micro-batch runs where the experts run one product per expert (a CPU: model/moe.Segments; torch's
    CPU _grouped_mm is the same loop): every expert reached runs each stacked projection once per forward (twice
    under checkpointing), once for its input gradient and, when the base trains, once for its weight gradient.
    Each pays the device's call cost beyond its FLOPs (probe.product_call_s): 20-40 µs a bf16 product on a 2-core
    EPYC, where a 128 x 256 x 512 product's arithmetic is 80 µs."""
    m = arch.moe
    if m is None or not arch.sparse_layers:
        return 0.0
    projections = sum(1 for mod in arch.modules() if mod.group == "expert")  # kinds: gate_up and down
    passes = (2 if grad_ckpt else 1) + 1 + (1 if method.trains_base else 0)
    return arch.sparse_layers * experts_hit(m.experts, m.top_k, tokens) * projections * passes


def expert_tile(arch: Arch, tokens: float) -> int:
    """Rows of a tile of LoRA's batched expert products (model/moe.Segments.tile): half the mean expert load,
    rounded up to a multiple of 16, between 16 and 32."""
    m = arch.moe
    half_mean = math.ceil(tokens * m.top_k / (2 * m.experts))
    return min(32, max(16, math.ceil(half_mean / 16) * 16))


def tile_padding(arch: Arch, tokens: float) -> float:
    """Zero rows per expert that LoRA's tiles carry: each expert reached pads its rows up to a whole tile, half a
    tile on average, spread over the experts here as the mean expert's share."""
    m = arch.moe
    hit = experts_hit(m.experts, m.top_k, tokens)
    return hit * expert_tile(arch, tokens) / 2 / m.experts


def tile_bytes(arch: Arch, targets: tuple[str, ...], r: int, tokens: float, compute_bytes: int) -> float:
    """Bytes one micro-batch's LoRA tiles move beyond their products (model/moe.Segments.lora and lora_backward),
    per adapted expert projection (d_in -> d_out) of each sparse layer, over its P = tokens x top_k sorted rows
    plus the padding, which stay in tiles from dispatch to combine (no copy into or out of them): the low-rank
    output added in place into the base product's (read P d_out, forward) and into the input gradient (read
    P d_in, backward); the padding rows zero-filled in both (padding (d_in + d_out)); each tile's A and B
    gathered, forward and backward, and dA and dB summed per expert (3 r (d_in + d_out) per tile)."""
    m = arch.moe
    if m is None:
        return 0.0
    padding = tile_padding(arch, tokens) * m.experts
    rows = tokens * m.top_k + padding
    tiles = rows / expert_tile(arch, tokens)
    total = 0.0
    for mod in arch.modules():
        if mod.group != "expert" or mod.name not in targets:
            continue
        width = mod.d_in + mod.d_out
        total += arch.sparse_layers * (rows * width + padding * width + tiles * 3 * r * width)
    return total * compute_bytes


def head_chunks(loss_tokens: float, chunk: int) -> int:
    """Chunks the fused head and loss split a micro-batch's target positions into."""
    return max(1, math.ceil(loss_tokens / chunk))


def split_gemms(shapes: list[tuple[int, int, int, int]], compute_bytes: int, ridge: float) -> tuple[float, float]:
    """(FLOPs of the compute-bound GEMMs, operand bytes of the memory-bound ones). A GEMM's intensity is
    2mkn / (bytes of A, B and C): above the device's ridge (peak FLOP/s per byte/s) the units set its pace."""
    flops = moved = 0.0
    for m, k, n, count in shapes:
        f = 2.0 * m * k * n
        b = compute_bytes * (m * k + k * n + m * n)
        if f / b >= ridge:
            flops += f * count
        else:
            moved += b * count
    return flops, moved


def attention_flops(arch: Arch, tokens: int, keys_per_token: float, grad_ckpt: bool) -> float:
    """QKᵀ and AV: 4·H·Q FLOPs per (query, key) pair per layer forward, twice that backward; a recomputed
    forward under gradient checkpointing adds one more forward."""
    passes = 4.0 if grad_ckpt else 3.0
    return passes * 4.0 * arch.layers * arch.heads * arch.head_dim * keys_per_token * tokens


def score_bytes_per_pair(compiled: bool) -> tuple[float, float]:
    """(forward, backward) bytes per query-key pair per head per layer of attention that writes its scores
    (model/attention._SlotAttention). Eager forward: the scores written in bf16 (2), cast to fp32 (2 + 4),
    scaled (8), masked (9), log-sum-exp (8: max and sum), subtracted (8), exponentiated (8), cast back (4 + 2),
    read by the product with V (2): 57. Eager backward: dP written (2), P read for dV (2), P and dP cast to
    fp32 (12), their product and row sum (16), the difference (8), the product with P (12), scaled (8), cast
    (6), dS read by two products (4): 70. Compiled, each chain is one fused kernel: forward writes the scores,
    reads them once and writes P, which the product reads (8); backward writes dP, reads P twice and dP once,
    writes dS, which two products read (14)."""
    return (8.0, 14.0) if compiled else (57.0, 70.0)


def masked_head_pairs(arch: Arch, tokens: float, keys_per_token: float, grad_ckpt: bool) -> float:
    """(head, query, key) triples one micro-batch's attention passes over, forward, backward (twice the work, one
    more pass) and a recomputed forward: what an attention kernel that reads a padding mask per head does per
    pair, beside its FLOPs (docs/formulas.md, "The HF Trainer + PEFT stack from its parts")."""
    passes = 4.0 if grad_ckpt else 3.0
    return passes * arch.layers * arch.heads * keys_per_token * tokens


def elementwise_elements_per_token(
    arch: Arch, targets: tuple[str, ...], method: Method, compiled: bool, fused_ops: bool = False
) -> float:
    """Elements read and written per token per forward by the non-GEMM ops of all blocks (the backward moves
    twice as many). Eager: HF's RMSNorm upcasts and runs ~7 kernels (8h), rotary's rotate_half, products and sum
    ~6 passes over q and k, the attention layout copies 2 over q, k, v and the output, SiLU and product 5i,
    two residual adds 3h each, LoRA's scale and add 5 per output element of each adapted matrix. Compiled blocks
    fuse each chain into one read and one write: norms 2h, rotary 2, layouts 1, SwiGLU 3i, adds into the norms,
    LoRA's scale-and-add 2."""
    h, i = arch.hidden, arch.mlp_width
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    # LoRA's scale-and-add per output element a token passes, per layer (top_k times an expert kind's).
    outs = 0 if method.trains_base else sum(m.active * m.d_out for m in arch.modules() if m.name in targets)
    outs /= arch.layers
    if compiled:
        per_layer = 2 * 2 * h + 2 * (q + kv) + (2 * q + 2 * kv) + 3 * i + 2 * outs
    elif fused_ops:  # Liger's kernels: each norm, rotary and SwiGLU one read and one write, the rest eager
        per_layer = 2 * 2 * h + 2 * (q + kv) + 2 * (2 * q + 2 * kv) + 3 * i + 2 * 3 * h + 5 * outs
    else:
        per_layer = 2 * 8 * h + 12 * (q + kv) + 2 * (2 * q + 2 * kv) + 5 * i + 2 * 3 * h + 5 * outs
    return float(arch.layers * per_layer)


def routing_bytes_per_token(arch: Arch, compute_bytes: int) -> float:
    """Bytes an MoE model's routing moves per token per forward, over its sparse layers: the router's logits
    written, softmax and top-k in fp32 (~6 passes over 4 B per expert); the permutation gathers top_k copies of
    the hidden state (one read, top_k writes), and the combine reads top_k expert outputs and their weights
    and writes the sum (top_k reads, one write); the sort of the top_k expert ids (8 B each, ~4 passes). The
    backward moves about twice as much (scatter of the gradients, the same gathers reversed). 0 for a dense model."""
    m = arch.moe
    if m is None:
        return 0.0
    h, k = arch.hidden, m.top_k
    per_layer = 24 * m.experts + compute_bytes * h * (2 + 2 * k) + 32 * k
    return float(arch.sparse_layers * per_layer)


def eager_score_bytes_per_pair() -> tuple[float, float]:
    """(forward, backward) bytes per query-key pair per head per layer of transformers' eager attention. Forward:
    QKᵀ written in bf16 (2), the mask added (2 + 2), softmax in fp32 (2 + 4), cast back (4 + 2), read by the
    product with V (2): 20. Backward: dP written (2), cast to fp32 (2 + 4), softmax's backward reads P and dP and
    writes dS (12), cast back (4 + 2), read by two products (4): 30."""
    return 20.0, 30.0


def loss_bytes_per_token(arch: Arch, compute_bytes: int, whole_logits: bool = False) -> float:
    """The loss over the vocabulary, per position with a target: logits written and read in the compute dtype,
    upcast to fp32 and reduced (log-sum-exp), the gradient written in fp32 and cast back: ~2 + 2 reads/writes in
    the compute dtype and 4 fp32 passes. transformers' whole-logits loss adds two fp32 passes: `logits.float()`
    writes an fp32 copy that log_softmax reads, and log_softmax writes fp32 log-probs that its backward reads."""
    return arch.vocab * (4.0 * compute_bytes + 4 * 4.0 + (8.0 if whole_logits else 0.0))


def optimizer_bytes_per_param(fused: bool) -> float:
    """Bytes an AdamW step moves per trainable parameter. Fused: parameter, gradient and two moments read (16 B),
    three written (12 B). foreach (HF's `adamw_torch`): each of its ~10 element-wise ops (two moment updates,
    sqrt, bias corrections, division, eps, addcdiv, weight decay) reads and writes its fp32 operands: ~80 B."""
    return 28.0 if fused else 80.0


def head_gradient_bytes(arch: Arch, compute_bytes: int, loss_tokens: float) -> float:
    """A trained head's weight gradient, per micro-batch, as train/loss.head_weight_grad makes it in backward: per
    head weight, the fp32 weight cast to the compute dtype again (4 + c B) and each slice's product written (c)
    and, below fp32, widened into the fp32 gradient (c + 4); per logit of the recomputed slices, written (c),
    upcast (c + 4), shifted and exponentiated (8), scaled (8) and cast back for the product (4 + c)."""
    widen = compute_bytes + 4 if compute_bytes < 4 else 0
    per_logit = 3 * compute_bytes + 24
    return arch.vocab * arch.hidden * (4 + 2 * compute_bytes + widen) + arch.vocab * loss_tokens * per_logit


def step_bytes(
    arch: Arch,
    method: Method,
    base_quant: str,
    trainable: int,
    micro_batches: int,
    grad_ckpt: bool,
    fused_optimizer: bool = True,
) -> float:
    """Per-step traffic that does not scale with tokens: fused AdamW reads parameter, gradient and two moments
    (16 B) and writes three (12 B) per trainable parameter; gradient clipping (on by default, max_grad_norm 1)
    reads every fp32 gradient for the norm and scales it in place (12 B); gradients accumulate (read + write
    fp32, 8 B) each micro-batch; an nf4 base is dequantized (0.5 B read, 2 B written) on every forward and
    backward; full fine-tuning's fp32 weights are cast for every micro-batch's products and their gradients cast
    back."""
    total = trainable * (optimizer_bytes_per_param(fused_optimizer) + 12.0 + 8.0 * micro_batches)
    if method.trains_base:  # autocast casts each fp32 weight to 16 bits (4 + 2 B) and each gradient back (2 + 4 B)
        total += arch.total_params * 12.0 * micro_batches
    if base_quant == "nf4":
        passes = 3 if grad_ckpt else 2
        total += arch.block_linear_params * 2.5 * passes * micro_batches
    return total


def launches_per_micro_batch(
    arch: Arch, targets: tuple[str, ...], method: Method, compiled: bool, grad_ckpt: bool, fused_ops: bool = False
) -> float:
    """Kernel launches of one micro-batch. Eager, per block forward: norms 2 x 7, rotary 2 x 6, attention 6,
    SwiGLU 2, residual adds 2, its 7 GEMMs, and 4 per adapted matrix (A, B, scale, add); the backward launches
    about twice the forward. Compiled blocks keep the GEMMs (7 + 2 per adapter) and attention's kernels and fuse
    the rest into ~5 kernels; Liger's kernels make the norms' 14, rotary's 12 and SwiGLU's 2 four (24 fewer). The head, loss
    and embedding add ~100."""
    adapters = 0 if method.trains_base else len(targets)
    per_fwd = (14 + 2 * adapters + 2 + 5) if compiled else (43 - (24 if fused_ops else 0) + 4 * adapters)
    passes = 4 if grad_ckpt else 3
    return arch.layers * per_fwd * passes + arch.sparse_layers * ROUTING_LAUNCHES * passes + 100.0


# Kernel launches of an MoE layer's routing per pass: the router's GEMM, softmax, top-k, normalisation, the sort of
# expert ids and its counts, the gather and the weighted scatter-add, and the grouped products' setup.
ROUTING_LAUNCHES = 12


def work(
    arch: Arch,
    method: Method,
    base_quant: str,
    targets: tuple[str, ...],
    r: int,
    grad_ckpt: bool,
    shape: Shape,
    ridge: float,
) -> Work:
    """One optimizer step's work on a device whose ridge (peak FLOP/s over bytes/s) is `ridge`."""
    mb, cb = shape.micro_batches, shape.compute_bytes
    gemms = gemm_shapes(
        arch,
        method,
        targets,
        r,
        shape.tokens,
        grad_ckpt,
        shape.loss_tokens,
        shape.loss_chunk,
        shape.imbalance,
        shape.expert_segments,
    )
    gemm_f, gemm_b = split_gemms(gemms, cb, ridge)
    fwd_passes = 4.0 if grad_ckpt else 3.0  # forward + backward (2x), + the recomputed forward
    elements = elementwise_elements_per_token(arch, targets, method, shape.compiled, shape.fused_ops) * fwd_passes
    # Full fine-tuning keeps fp32 weights under autocast (model/adapters.py): the residual stream and its
    # element-wise ops run in fp32.
    per_token = elements * (4 if method.trains_base else cb) + routing_bytes_per_token(arch, cb) * fwd_passes
    loss = loss_bytes_per_token(arch, cb, shape.whole_logits) * shape.loss_tokens
    per_micro_batch = per_token * shape.tokens + loss
    if shape.expert_segments and not method.trains_base:
        per_micro_batch += tile_bytes(arch, targets, r, shape.tokens, cb)
    if shape.scored_keys_per_token:
        fwd, bwd = eager_score_bytes_per_pair() if shape.eager_attention else score_bytes_per_pair(shape.compiled)
        pairs = shape.scored_keys_per_token * shape.tokens * arch.heads * arch.layers
        per_micro_batch += pairs * (fwd * (2 if grad_ckpt else 1) + bwd)
    if method.trains_base:
        per_micro_batch += head_gradient_bytes(arch, cb, shape.loss_tokens)
    trainable = arch.total_params if method.trains_base else adapter_params(arch, targets, r)
    memory = per_micro_batch * mb + step_bytes(
        arch, method, base_quant, trainable, mb, grad_ckpt, shape.fused_optimizer
    )
    launches = launches_per_micro_batch(arch, targets, method, shape.compiled, grad_ckpt, shape.fused_ops) * mb + 20.0
    attention = attention_flops(arch, shape.tokens, shape.keys_per_token, grad_ckpt) * mb
    # Eager attention's products are batched GEMMs: they run at the GEMMs' rate, not a fused kernel's.
    gemm_f, attention = (gemm_f * mb + attention, 0.0) if shape.eager_attention else (gemm_f * mb, attention)
    calls = expert_product_calls(arch, method, grad_ckpt, shape.tokens) * mb if shape.expert_segments else 0.0
    return Work(
        matmul_flops=gemm_f,
        matmul_bytes=gemm_b * mb,
        attention_flops=attention,
        memory_bytes=memory,
        launches=launches,
        calls=calls,
    )


def breakdown(w: Work, peak_flops: float, bandwidth_bps: float, c: Constants, call_s: float = 0.0) -> Breakdown:
    """The step's seconds by part (module docstring); memory-bound GEMMs count under matmul, at the bandwidth; the
    per-expert product calls under fixed, at the device's measured `call_s`."""
    bw = bandwidth_bps * c.bandwidth
    return Breakdown(
        matmul_s=w.matmul_flops / (peak_flops * c.matmul) + w.matmul_bytes / bw,
        attention_s=w.attention_flops / (peak_flops * c.attention),
        memory_s=w.memory_bytes / bw,
        fixed_s=w.launches * c.launch_s + w.calls * call_s,
    )
