"""Peak memory of one training process, by component, in bytes.

Derivations (FORMULAS.md; per-parameter table of EleutherAI "Transformer Math 101"):
- Frozen base weights live in the compute dtype (2 B for bf16/fp16). int8 (LLM.int8(), arXiv 2208.07339)
  is 1 B/param plus one fp32 absmax per output row. NF4 with double quantization (QLoRA, arXiv
  2305.14314, Sec. 3) is 4 bits + an 8-bit absmax per 64 weights + an fp32 absmax per 256 such blocks =
  0.5 + 1/64 + 4/16384 B/param (4.127 bits). Embedding, LM head and norms stay in the compute dtype.
- Trainable weights are fp32 (tunelab: peft keeps adapters fp32; full fine-tuning keeps fp32 master
  weights), so each trainable parameter costs 4 (weight) + 4 (grad) + 8 (AdamW's two fp32 states) B.
  Under 16-bit autocast full fine-tuning also holds a 16-bit copy of every weight from the forward to
  its backward (autocast caches casts of leaf tensors).
- Activations, per token and decoder layer, for the Llama block (RMSNorm in fp32, SwiGLU, SDPA; no
  dropout), derived tensor by tensor from what autograd saves (a = compute-dtype bytes):
    RMSNorm x2: the fp32 input (4h each); with a trained norm weight also the normalized fp32 (4h each)
    attention: q, k, v after RoPE (a·(H·Q + 2·KV·Q)) and the SDPA output (a·H·Q); SDPA/flash attention
      keeps no T×T matrix (Korthikanti et al. 2022's 5·a·s/h term is gone)
    MLP: gate output (silu's input), silu output and up output: 3·a·I
    linear inputs: a trained weight saves its input for the weight gradient. Under autocast each linear
      casts its own copy (q, k, v do not share); a LoRA adapter saves its own 16-bit copy of the input
      plus A's output (a·r); a frozen base weight saves nothing (its input gradient needs only W).
    LoRA dropout > 0 adds a mask (1 B) and the dropped copy (a) per adapted input.
  Gradient checkpointing keeps each layer's input (the residual stream) and one layer's activations.
- Logits: tunelab's loss (train/loss.py) runs the LM head only on loss positions, in chunks of at most
  `loss_chunk` rows; at the peak (the loss backward) one chunk holds the fp32 log-softmax output, its
  gradient, the fp32 logits gradient (4 B each) and the 16-bit logits gradient (a).
- Runtime overhead (CUDA context, allocator caching): an assumption, or calibrated per device.
- Multi-GPU: DDP replicates everything (+ a gradient bucket copy); ZeRO-2 / FSDP SHARD_GRAD_OP shards
  gradients and optimizer states over the world size; ZeRO-3 / FSDP FULL_SHARD shards the weights too,
  plus one gathered layer (ZeRO, Rajbhandari et al. 2020, arXiv 1910.02054, Sec. 5).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .arch import Arch
from .flops import adapter_params

NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
ADAM_STATE_BYTES = 8  # exp_avg + exp_avg_sq, fp32
TRAINABLE_BYTES = 4  # fp32 weights (and fp32 grads)
SHARDINGS = ("single", "ddp", "zero2", "zero3")


@dataclass(frozen=True)
class MemorySetup:
    method: str  # lora | dora | qlora | full
    base_quant: str  # none | int8 | nf4
    compute_bytes: int  # 2 (bf16/fp16, autocast) or 4 (fp32)
    micro_batch: int
    row_len: int  # width of the widest micro-batch row
    loss_rows: int  # loss positions per micro-batch
    loss_chunk: int  # rows of logits alive at once (train/loss.py LOGIT_CHUNK)
    grad_ckpt: bool
    targets: tuple[str, ...]
    r: int
    lora_dropout: float = 0.0
    runtime_overhead: int = 0
    sharding: str = "single"
    world: int = 1


@dataclass(frozen=True)
class MemoryBreakdown:
    weights: int
    adapters: int
    gradients: int
    optimizer_states: int
    activations: int
    logits_loss: int
    runtime_overhead: int

    @property
    def total(self) -> int:
        return sum(asdict(self).values())

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def frozen_weight_bytes(arch: Arch, base_quant: str, compute_bytes: int) -> float:
    blocks = arch.block_linear_params
    rest = arch.total_params - blocks  # embedding, untied LM head, norms: never quantized
    if base_quant == "nf4":
        block_bytes = blocks * NF4_BYTES
    elif base_quant == "int8":
        row_scales = arch.layers * sum(d_out for _, d_out in arch.linears().values())
        block_bytes = blocks * 1.0 + row_scales * 4.0
    else:
        block_bytes = blocks * compute_bytes
    return block_bytes + rest * compute_bytes


def trainable_params(arch: Arch, s: MemorySetup) -> int:
    if s.method == "full":
        return arch.total_params
    extra = 0
    if s.method == "dora":  # one fp32 magnitude per output feature of each adapted matrix
        shapes = arch.linears()
        extra = arch.layers * sum(shapes[t][1] for t in s.targets)
    return adapter_params(arch, s.targets, s.r) + extra


def activation_bytes_per_token_layer(arch: Arch, s: MemorySetup) -> float:
    a, h, i = s.compute_bytes, arch.hidden, arch.intermediate
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    shapes = arch.linears()
    full = s.method == "full"
    autocast = a < 4
    norms = 2 * 4 * h * (2 if full else 1)
    attention = a * (q + 2 * kv) + a * q
    mlp = 3 * a * i
    if full:
        if autocast:  # every linear saves its own 16-bit cast of its input
            inputs = a * sum(d_in for d_in, _ in shapes.values())
        else:  # fp32: q/k/v share the norm output, gate/up share theirs
            inputs = a * (h + q + h + i)
        adapters = 0.0
    else:
        adapted = [shapes[t][0] for t in s.targets]
        if autocast:
            inputs = a * sum(adapted)
        else:
            groups = {"attn_in": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "mlp_in": ("gate_proj", "up_proj"), "down": ("down_proj",)}
            inputs = a * sum(shapes[g[0]][0] for g in groups.values() if set(g) & set(s.targets))
        adapters = len(adapted) * a * s.r
        if s.lora_dropout > 0:
            adapters += sum(adapted) * (1 + a)
    return norms + attention + mlp + inputs + adapters


def activation_bytes(arch: Arch, s: MemorySetup) -> float:
    tokens = s.micro_batch * s.row_len
    per_layer = activation_bytes_per_token_layer(arch, s) * tokens
    residual = 4 * arch.hidden * tokens  # the final norm's fp32 input
    if s.grad_ckpt:
        # each layer's saved input (residual stream, compute dtype or fp32 for full) + one layer recomputed
        stream = 4 if s.method == "full" else s.compute_bytes
        return arch.layers * stream * arch.hidden * tokens + per_layer + residual
    return arch.layers * per_layer + residual


def logits_bytes(arch: Arch, s: MemorySetup) -> float:
    rows = min(s.loss_rows, s.loss_chunk)
    selected = s.loss_rows * arch.hidden * s.compute_bytes  # hidden states gathered at loss positions
    return rows * arch.vocab * (12 + s.compute_bytes) + selected


def breakdown(arch: Arch, s: MemorySetup) -> MemoryBreakdown:
    """Peak memory per process (per GPU when sharded): everything alive at the start of the last backward
    of an optimizer step, when all activations and the logits are alive and the states exist."""
    trainable = trainable_params(arch, s)
    if s.method == "full":
        weights = arch.total_params * TRAINABLE_BYTES
        if s.compute_bytes < 4:
            weights += arch.total_params * s.compute_bytes  # autocast's cached 16-bit copies
        adapters = 0
    else:
        weights = frozen_weight_bytes(arch, s.base_quant, s.compute_bytes)
        adapters = trainable * TRAINABLE_BYTES
    grads = trainable * TRAINABLE_BYTES
    states = trainable * ADAM_STATE_BYTES
    world = max(1, s.world)
    if s.sharding == "ddp":
        grads *= 2  # DDP's flat all-reduce buckets copy the gradients
    elif s.sharding == "zero2":
        grads, states = grads / world, states / world
    elif s.sharding == "zero3":
        layer = arch.block_linear_params / arch.layers
        gathered = layer * (TRAINABLE_BYTES if s.method == "full" else s.compute_bytes)
        if s.method == "full":
            weights = weights / world + gathered
        else:
            weights, adapters = weights / world + gathered, adapters / world
        grads, states = grads / world, states / world
    return MemoryBreakdown(
        weights=round(weights), adapters=round(adapters), gradients=round(grads), optimizer_states=round(states),
        activations=round(activation_bytes(arch, s)), logits_loss=round(logits_bytes(arch, s)),
        runtime_overhead=s.runtime_overhead,
    )


def max_micro_batch(arch: Arch, s: MemorySetup, capacity: int, loss_per_row: float, limit: int = 4096) -> int:
    """Largest micro-batch whose predicted peak fits in `capacity` bytes (0 when not even 1 fits).
    Peak grows monotonically with the micro-batch, so a binary search suffices."""
    from dataclasses import replace

    def fits(b: int) -> bool:
        trial = replace(s, micro_batch=b, loss_rows=max(1, round(loss_per_row * b)))
        return breakdown(arch, trial).total <= capacity

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
