"""Peak memory of one training process, by component, in bytes.

Derivations (docs/formulas.md; per-parameter table of EleutherAI "Transformer Math 101"):
- Frozen base weights live in the compute dtype (2 B for bf16/fp16). int8 (LLM.int8(), arXiv 2208.07339)
  is 1 B/param plus one fp32 absmax per output row. NF4 with double quantization (QLoRA, arXiv
  2305.14314, Sec. 3) is 4 bits + an 8-bit absmax per 64 weights + an fp32 absmax per 256 such blocks =
  0.5 + 1/64 + 4/16384 B/param (4.127 bits). Embedding, LM head and norms stay in the compute dtype.
- Trainable weights are fp32 (tunelab: peft keeps adapters fp32; full fine-tuning keeps fp32 master
  weights), so each trainable parameter costs 4 (weight) + 4 (grad) + 8 (AdamW's two fp32 states) B.
  Under 16-bit autocast full fine-tuning also holds a 16-bit copy of every block weight from the forward to
  its backward (autocast caches casts of leaf tensors); the embedding is gathered, not cast, and the loss casts
  the head itself (logits). FSDP2 gathers weights in the compute dtype and runs no autocast: no copies.
- Activations, per token and decoder layer, for the Llama block (RMSNorm in fp32, SwiGLU; no dropout),
  derived tensor by tensor from what autograd saves (a = compute-dtype bytes). Checked against the
  saved-tensor sums of the quickstart (SmolLM2-135M, 16 x 256 packed rows, LoRA r 32 on every linear, bf16),
  eager and compiled; compiled full fine-tuning also holds an fp32 copy of the embedding matrix, not modeled
  (benchmarks/design-decisions_cpu_2026-11-22.md#activation-count-against-saved-tensors).
  Eager:
    RMSNorm x2: the fp32 input (4h each); with a trained norm weight also the normalized fp32 (4h each)
    MLP: gate output (silu's input), silu output and up output: 3·a·I
    linear inputs: a trained weight saves its input for the weight gradient. Full fine-tuning under
      autocast casts each linear's fp32 input on its own (q, k, v do not share). LoRA's frozen base weights
      are in the compute dtype, so the block's activations already are, and linears reading the same input
      share it (q/k/v, gate/up). A LoRA adapter also saves A's output (a·r); a frozen base weight alone
      saves nothing (its input gradient needs only W).
    LoRA dropout > 0: each adapter saves its keep mask (1 B) and the dropped copy of its input (a) instead of
      the input (model/lora_linear.py), so a shared input is no longer kept for them.
  Compiled (recipes/train.compile_blocks, activation memory budget 0.9): the partitioner keeps the block's
  input (the residual stream: fp32 for full fine-tuning, whose master weights make it fp32), one more
  hidden-sized tensor in the compute dtype (o_proj's input or the residual after attention; the sums do
  not tell which), the gate and up outputs, the two norms' fp32 1/rms and A's outputs, and recomputes the
  norm outputs and SiLU·up in backward. With LoRA dropout masks from torch.rand it keeps each adapter's
  keep mask (1 B) and recomputes the dropped copies (measured on CPU; on GPUs, where the masks come from
  torch.rand, an assumption); on CPU backward draws the mask again from its seed and nothing is added
  (the partitioner then also recomputed the norms' 1/rms and attention's probabilities on the test model
  of tests/unit/plan/test_plan_memory_saved.py, 15% below this model; not modeled, so plan stays above).
  Attention, per attention position (a slot position when packed sequences run in per-sequence slots,
  data.packing; padding slots and slot-length rounding included): q, k, v and its output (a·(2·H·Q +
  2·KV·Q); the output not on the eager slot path, whose backward does without it), plus either the
  probabilities (a·H·L for slots of length L: tunelab's CPU slot path, model/attention.py) or SDPA's fp32
  log-sum-exp (4·H; flash/efficient kernels keep no T×T matrix, Korthikanti et al. 2022's 5·a·s/h term
  is gone). FlexAttention (attention=flex, auto on CUDA) runs over whole rows and keeps the same q, k, v,
  output and fp32 log-sum-exp per head and token; its BlockMask (B·T/128 block counts and B·(T/128)² block
  indices, int32) and the document ids (8·B·T) are one per micro-batch, shared by every layer, and left out.
  Gradient checkpointing keeps each layer's input (the residual stream) and one layer's activations.
  Activation offloading (model/offload.py, CUDA) moves what the layers save to pinned host memory: the device
  holds the layers in flight, OFFLOAD_LAYERS of them (the one computing and the one being copied: in forward
  the layer before is still being copied out, in backward the layer before is prefetched), with gradient
  checkpointing that many layer inputs plus the one recomputed layer. Pinned host memory holds a copy of every
  layer's (`offloaded_bytes`).
- Logits: tunelab's loss (train/loss.py) runs the LM head only on loss positions, in chunks of `loss_chunk`
  rows, and computes its gradients in the forward, at the end of which every activation is alive: two scratch
  buffers of a whole chunk's logits, fp32 and compute dtype (4 + a per element, allocated at the full chunk
  and kept across steps; the softmax and its gradient are computed in place), with final-logit soft-capping
  three more fp32 ones (tanh(z/c), its square, one minus that), and the hidden states gathered at the loss
  positions and their gradient (a each). Under full fine-tuning the loss also holds the head weight in the
  compute dtype (a per weight; FSDP's gathered weight already is) and its fp32 gradient (4), accumulated chunk
  by chunk from an increment made in the compute dtype and then in fp32 (a + 4, or 4 in fp32); its backward
  scales the gradient into a new fp32 tensor, which this bound covers.
- Runtime overhead (CUDA context, allocator caching): an assumption, or calibrated per device.
- Multi-GPU: DDP replicates everything (+ a gradient bucket copy); ZeRO-2 / FSDP SHARD_GRAD_OP shards
  gradients and optimizer states over the world size; ZeRO-3 / FSDP FULL_SHARD shards the weights too,
  plus one gathered layer (ZeRO, Rajbhandari et al. 2020, arXiv 1910.02054, Sec. 5) and the gathered root
  unit (embeddings, final norm, LM head: tunelab's FSDP keeps it gathered through the step, as the fused loss
  reads the head's weight outside the head's forward); full fine-tuning also holds the LM head's unsharded
  fp32 gradient (counted with the logits) from the loss to the root's reduce-scatter at the end of backward.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .arch import Arch
from .flops import adapter_params

NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
ADAM_STATE_BYTES = 8  # exp_avg + exp_avg_sq, fp32
TRAINABLE_BYTES = 4  # fp32 weights (and fp32 grads)


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
    compiled: bool = False  # decoder blocks through torch.compile
    slots: int = 0  # attention slots per micro-batch (plan.workload.EpochCounts); 0: attention over whole rows
    slot_len: int = 0
    attention_probs: bool = False  # attention keeps its probabilities (tunelab's CPU slot path)
    attention: str = "slots"  # model/attention.attention_path: flex | slots | sdpa | flash
    dropout_mask_kept: bool = True  # LoRA dropout's mask is kept for backward (not drawn again: device.hashed_dropout)
    offload: bool = False  # activation_offload on a CUDA device (model/offload.py): saved activations on the host


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


def stream_bytes(s: MemorySetup) -> int:
    """Bytes per element of the residual stream: fp32 under full fine-tuning (fp32 master weights make the
    embedding output fp32), else the compute dtype (frozen weights are stored in it)."""
    return 4 if s.method == "full" else s.compute_bytes


def _adapter_bytes(arch: Arch, s: MemorySetup) -> float:
    """Per token and layer: each adapter's A output, and with dropout its keep mask and (eager blocks) the
    dropped copy of its input. DoRA runs peft's own layer, whose output (m/‖W + sBA‖ - 1)·base + m/‖W + sBA‖·s·BAx
    keeps the base product and the adapter's product (two d_out-wide tensors) for the trained magnitude's
    gradient: measured exactly eager; compiled blocks kept 63% of it on tests/unit/plan/test_plan_memory_saved.py's
    model, and plan stays above."""
    if s.method == "full":
        return 0.0
    shapes = arch.linears()
    adapted = [shapes[t][0] for t in s.targets]
    out = len(adapted) * s.compute_bytes * s.r
    if s.method == "dora":
        out += 2 * s.compute_bytes * sum(shapes[t][1] for t in s.targets)
    if s.lora_dropout > 0 and not s.compiled:
        out += sum(adapted) * (1 + s.compute_bytes)  # mask and dropped copy
    elif s.lora_dropout > 0 and s.dropout_mask_kept:
        out += sum(adapted)  # the mask; compiled blocks recompute the copy
    return out


def row_bytes_per_token_layer(arch: Arch, s: MemorySetup) -> float:
    """What a decoder layer saves per token outside attention's own tensors (the module docstring)."""
    a, h, i = s.compute_bytes, arch.hidden, arch.intermediate
    if s.compiled:
        return stream_bytes(s) * h + a * arch.heads * arch.head_dim + 2 * a * i + 2 * 4 + _adapter_bytes(arch, s)
    shapes = arch.linears()
    full = s.method == "full"
    norms = 2 * 4 * h * (2 if full else 1)
    mlp = 3 * a * i
    groups = {
        "attn_in": ("q_proj", "k_proj", "v_proj"),
        "o": ("o_proj",),
        "mlp_in": ("gate_proj", "up_proj"),
        "down": ("down_proj",),
    }
    if full and a < 4:  # autocast casts each linear's fp32 input on its own
        inputs = a * sum(d_in for d_in, _ in shapes.values())
    elif s.lora_dropout > 0:  # adapters keep their dropped copies instead (_adapter_bytes); frozen linears nothing
        inputs = 0
    else:
        trained = set(shapes) if full else set(s.targets)
        inputs = a * sum(shapes[g[0]][0] for g in groups.values() if set(g) & trained)
    return norms + mlp + inputs + _adapter_bytes(arch, s)


def attention_bytes_per_position(arch: Arch, s: MemorySetup) -> float:
    """What attention saves per query position and layer: q, k, v, its output, and the probabilities or
    SDPA's log-sum-exp (the module docstring)."""
    a = s.compute_bytes
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    kept = a * arch.heads * s.slot_len if s.attention_probs else 4 * arch.heads
    # The eager slot path's backward needs no output (its softmax correction comes from P and dP); compiled,
    # the partitioner keeps a hidden-sized tensor there, as SDPA and flex keep their output.
    outputs = 0 if s.attention_probs and not s.compiled else q
    return a * (q + outputs + 2 * kv) + kept


# Layers whose saved activations are on the device at once under activation offloading (the module docstring).
OFFLOAD_LAYERS = 2


def _layer_bytes(arch: Arch, s: MemorySetup) -> tuple[float, float, float]:
    """(what one layer saves, one layer's input, the final norm's fp32 input), for one micro-batch."""
    tokens = s.micro_batch * s.row_len
    positions = s.slots * s.slot_len if s.slots else tokens
    per_layer = row_bytes_per_token_layer(arch, s) * tokens + attention_bytes_per_position(arch, s) * positions
    return per_layer, stream_bytes(s) * arch.hidden * tokens, 4 * arch.hidden * tokens


def activation_bytes(arch: Arch, s: MemorySetup) -> float:
    per_layer, layer_input, residual = _layer_bytes(arch, s)
    kept = min(arch.layers, OFFLOAD_LAYERS) if s.offload else arch.layers
    if s.grad_ckpt:
        # each layer's saved input (the residual stream) + one layer recomputed
        return kept * layer_input + per_layer + residual
    return kept * per_layer + residual


def offloaded_bytes(arch: Arch, s: MemorySetup) -> float:
    """Pinned host memory that activation offloading holds at the peak: the saved activations (or, with gradient
    checkpointing, the layer inputs) of every layer, each copied out as its forward ends."""
    if not s.offload:
        return 0.0
    per_layer, layer_input, _ = _layer_bytes(arch, s)
    return arch.layers * (layer_input if s.grad_ckpt else per_layer)


def max_seq_len(arch: Arch, s: MemorySetup, capacity: int, loss_per_position: float, limit: int = 1 << 22) -> int:
    """Largest seq_len, a multiple of 128 (FlexAttention's block), whose predicted peak fits in `capacity`
    bytes with rows packed full (the widest row is seq_len; `loss_per_position` of its positions have loss);
    0 when not even 128 fits. Peak grows with the row, so a binary search suffices. Attention over whole
    rows only (flex, sdpa, flash): per-sequence slots depend on the documents, not the row."""
    from dataclasses import replace

    def fits(blocks: int) -> bool:
        t = blocks * 128
        rows = max(1, round(loss_per_position * t * s.micro_batch))
        return breakdown(arch, replace(s, row_len=t, loss_rows=rows, slots=0, slot_len=0)).total <= capacity

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi * 128 <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit // 128 + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo * 128


def logits_bytes(arch: Arch, s: MemorySetup) -> float:
    """The loss's own memory at its peak, inside the forward (the module docstring)."""
    a = s.compute_bytes
    out = s.loss_chunk * arch.vocab * (4 + a) + 2 * s.loss_rows * arch.hidden * a
    if arch.logit_softcap:
        out += 3 * 4 * s.loss_chunk * arch.vocab
    if s.method == "full":
        head_copy = a if a < 4 and s.sharding != "zero3" else 0
        out += arch.vocab * arch.hidden * (head_copy + 4 + a + (4 if a < 4 else 0))
    return out


def breakdown(arch: Arch, s: MemorySetup) -> MemoryBreakdown:
    """Peak memory per process (per GPU when sharded): everything alive at the start of the last backward
    of an optimizer step, when all activations and the logits are alive and the states exist."""
    trainable = trainable_params(arch, s)
    if s.method == "full":
        weights = arch.total_params * TRAINABLE_BYTES
        if s.compute_bytes < 4 and s.sharding != "zero3":
            # autocast's cached 16-bit copies of the block weights (the module docstring)
            embedding_and_head = arch.vocab * arch.hidden * (1 if arch.tied else 2)
            weights += (arch.total_params - embedding_and_head) * s.compute_bytes
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
        # FSDP2 gathers in the compute dtype (plan/comm.py), full fine-tuning's fp32 master weights included.
        gathered = (arch.block_linear_params / arch.layers + root_params(arch)) * s.compute_bytes
        if s.method == "full":
            weights = weights / world + gathered
        else:
            weights, adapters = weights / world + gathered, adapters / world
        # Full fine-tuning's whole LM-head gradient, made by the loss (logits_bytes), waits for the root's
        # reduce-scatter at the end of backward.
        grads, states = grads / world, states / world
    return MemoryBreakdown(
        weights=round(weights),
        adapters=round(adapters),
        gradients=round(grads),
        optimizer_states=round(states),
        activations=round(activation_bytes(arch, s)),
        logits_loss=round(logits_bytes(arch, s)),
        runtime_overhead=s.runtime_overhead,
    )


def host_load_bytes(arch: Arch, s: MemorySetup) -> float:
    """CPU memory that loading the model takes in a process that reads the weights before FSDP shards them
    (train/distributed.shard): every weight in the compute dtype as read (frozen bases stay in it, adapters are
    small), and under full fine-tuning in fp32, the master weights' dtype, to which the weights are converted
    one tensor at a time before sharding (model/adapters.apply_adapter), so 4 B per parameter at the peak. With
    fsdp_cpu_ram_efficient_loading (configs/accelerate/fsdp2.yaml) only the main process holds this; without,
    every process does."""
    per = 4 if s.method == "full" else s.compute_bytes
    return arch.total_params * per


def root_params(arch: Arch) -> int:
    """The root unit of tunelab's FSDP (train/distributed.shard): embeddings, final norm and an untied LM head,
    gathered for the whole step, as the fused loss reads the head's weight outside the head's own forward."""
    return arch.total_params - arch.block_linear_params - 2 * arch.layers * arch.hidden


def max_micro_batch(arch: Arch, s: MemorySetup, capacity: int, loss_per_row: float, limit: int = 4096) -> int:
    """Largest micro-batch whose predicted peak fits in `capacity` bytes (0 when not even 1 fits).
    Peak grows monotonically with the micro-batch, so a binary search suffices."""
    from dataclasses import replace

    def fits(b: int) -> bool:
        slots = round(s.slots * b / s.micro_batch)  # slots grow with the rows packed into a micro-batch
        trial = replace(s, micro_batch=b, loss_rows=max(1, round(loss_per_row * b)), slots=slots)
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
