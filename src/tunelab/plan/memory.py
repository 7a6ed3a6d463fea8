"""Peak memory of one training process, by component, in bytes.

Each term is derived in docs/formulas.md ("Memory: the derivation, term by term"); the functions below keep one
line of why each.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..runtime import LOGIT_CHUNK, STEP_CHUNK
from .arch import Arch
from .flops import adapter_params
from .hfstack import LOSS_KERNELS
from .job import Job


def nf4_bytes(double_quant: bool = True, block: int = 64, outer: int = 256) -> float:
    """Bytes a weight of a bitsandbytes NF4 base: 4 bits, and one absmax a block of `block` weights, an fp32 one
    without double quantization, with it an 8-bit code and one fp32 scale a block of `outer` absmaxes."""
    return 0.5 + (1 / block + 4 / (block * outer) if double_quant else 4 / block)


def gptq_bytes(bits: int = 4, group: int = 128) -> float:
    """Bytes a weight of a GPTQ base: `bits` packed into int32 words, and a group of `group` input rows sharing
    one fp16 scale and one packed `bits`-bit zero point."""
    return bits / 8 + (2 + bits / 8) / group


def dequant_scratch_bytes(arch: Arch, compute_bytes: int) -> float:
    """A 4-bit base in training dequantizes each weight to the compute dtype for its product (bitsandbytes'
    matmul_4bit forward, and again for backward's input gradient): the largest block linear, alive at once."""
    return max(d_in * d_out for d_in, d_out in arch.linears().values()) * compute_bytes


NF4_BYTES = nf4_bytes()  # QLoRA's default (bnb_4bit_use_double_quant=True)


def four_bit_bytes(job: Job) -> float:
    """Bytes a weight of the job's 4-bit base: GPTQ's where the tool's model is a GPTQ one, else NF4's with or
    without double quantization (Job.parts)."""
    p = job.parts
    return gptq_bytes(p.gptq_bits) if p.gptq_bits else nf4_bytes(p.double_quant)


# DeepSpeed's defaults (deepspeed/runtime/zero/config.py): the gradient-reduce and the parameter-allgather
# buckets (stages 1-2), ZeRO-3's prefetch bucket and its cap on live gathered parameters, in elements.
ZERO_REDUCE_BUCKET = 500_000_000
ZERO_ALLGATHER_BUCKET = 500_000_000
ZERO3_PREFETCH_BUCKET = 50_000_000
ZERO3_MAX_LIVE = 1_000_000_000


def zero_buffer_bytes(stage: int, trainable: int, total: int, compute_bytes: int, weight_bytes: int) -> float:
    """What DeepSpeed ZeRO adds on one GPU, where it shards nothing: an fp32 master copy of the trained weights
    where they are kept in 16 bits (its optimizer steps fp32 partitions), its gradient-reduce bucket and, stages 1-2,
    the allgather bucket of the updated weights (each capped by what is trained); stage 2's contiguous gradient
    buffer (a second copy of the gradients in the compute dtype); stage 3's prefetch bucket and live gathered
    weights (capped by the model). 0 for stage 0."""
    if stage == 0:
        return 0.0
    a = compute_bytes
    master = trainable * 4 if weight_bytes < 4 else 0
    reduce = min(trainable, ZERO_REDUCE_BUCKET) * a
    if stage == 3:
        return master + reduce + min(total, ZERO3_PREFETCH_BUCKET + ZERO3_MAX_LIVE) * a
    gather = min(trainable, ZERO_ALLGATHER_BUCKET) * a
    return master + reduce + gather + (trainable * a if stage == 2 else 0)


# The CUDA context and the libraries' handles and workspaces a CUDA process holds outside PyTorch's caching
# allocator (nvidia-smi counts them, torch.cuda.max_memory_reserved does not): docs/formulas.md's 0.3-1.0 GiB for
# a context with lazy module loading, its middle. Assumption; the rest of the catalog's runtime overhead is the
# allocator's reserve.
CUDA_CONTEXT_BYTES = 512 * 2**20


@dataclass(frozen=True)
class Figures:
    """The three peaks a published figure can be (MemoryBreakdown.figures): PyTorch's allocated peak
    (max_memory_allocated; torchtune's `peak_memory_active` is the same tensors), the caching allocator's reserved
    peak (max_memory_reserved: allocated plus freed blocks it keeps), and the process as nvidia-smi shows it
    (reserved plus the CUDA context)."""

    allocated: int
    reserved: int
    process: int

    def of(self, kind: str) -> int:
        return getattr(self, FIGURE_KINDS[kind])


# What a published memory figure counts -> the Figures field it is compared with.
FIGURE_KINDS = {"allocated": "allocated", "active": "allocated", "reserved": "reserved", "process": "process"}


def stated_figures(allocated: float, overhead: int, context: int, varied_reserve: float = 0.0) -> Figures:
    """From the model's terms (`allocated`) and the device's runtime overhead (`overhead`, of which `context` is
    outside the allocator): reserved = allocated + the allocator's reserve (the overhead less the context, plus
    `varied_reserve`: blocks cut for shorter rows that the longest cannot reuse), process = reserved + context."""
    reserved = allocated + max(0, overhead - context) + varied_reserve
    return Figures(round(allocated), round(reserved), round(reserved + min(context, overhead)))


def varied_reserve_bytes(arch: Arch, job: Job, s: Layout, mean_row: float) -> float:
    """Rows of varied length padded per batch (an HF stack's `longest` padding): the caching allocator keeps the
    blocks it cut for narrower batches, which the widest cannot reuse, so the reserve grows by about one layer's
    saved activations at the widest row less at the mean (at most one layer: blocks of a whole layer's size are
    split and reused for the next). 0 where every row has one width (packed, max_length)."""
    if s.row_len <= mean_row:
        return 0.0
    per_layer, _, _ = _layer_bytes(arch, job, s)
    return per_layer * (1 - mean_row / s.row_len)


TRAINABLE_BYTES = 4  # fp32 weights (and fp32 grads); full fine-tuning's `weights: bf16` is Job.weight_bytes


@dataclass(frozen=True, kw_only=True)
class Layout:
    """What one process holds that the settings alone do not say: what plan derives from the job (its sections),
    the data's micro-batches and the device. The settings themselves are read from the job."""

    compute_bytes: int  # 2 (bf16/fp16, autocast) or 4 (fp32): the run's precision on the device
    targets: tuple[str, ...]  # the adapted modules, lora.targets resolved against the architecture
    row_len: int  # width of the widest micro-batch row
    loss_rows: int  # loss positions per micro-batch
    loss_chunk: int = LOGIT_CHUNK  # rows of logits alive at once (train/loss.py)
    runtime_overhead: int = 0
    # Of runtime_overhead, the freed pages held at a peak inside backward that a full fine-tune on a CPU returns
    # before an optimizer step with scratch (optimizers.Optimizer.returns_pages_before_step); 0 where it does not.
    pages_returned_before_step: int = 0
    sharding: str = "single"
    world: int = 1
    slots: int = 0  # attention slots per micro-batch (plan.workload.EpochCounts); 0: attention over whole rows
    slot_len: int = 0
    attention_probs: bool = False  # attention keeps its probabilities (tunelab's CPU slot path)
    attention: str = "slots"  # runtime.attention_path: flex | slots | sdpa | flash
    # Whole rows through SDPA under a boolean mask, eager, on a CPU (the slot path where slots do not pay, and
    # unpacked rows): rows of the (rows, 1, T, T) mask SDPA keeps per layer in the compute dtype (the micro-batch's
    # rows of block-diagonal mask when packed, one causal mask unpacked); under a mask transformers repeats k and v
    # to every query head. 0 elsewhere.
    row_mask: int = 0
    dropout_mask_kept: bool = True  # LoRA dropout's mask is kept for backward (not drawn again: runtime.hashed_dropout)
    offload_capable: bool = False  # a CUDA device: unified memory pages out (paged optimizer states)
    offload: bool = False  # activation_offload on a CUDA device (model/offload.py): saved activations on the host
    reference_copy: bool = False  # a frozen copy of the model as DPO's reference (full fine-tuning)
    reference_forward: bool = False  # each step runs the reference forward (DPO, not precomputed)
    # A CPU: torchtune's chunked output (the head over each sequence chunk of a micro-batch, a strided 3-D input)
    # goes through aten's bmm, which on a CPU copies the head weight once a row of the micro-batch (measured,
    # benchmarks/plan-accuracy/cpu-memory-parts_epyc-avx512bf16-2c_2026-12-07.md); on CUDA not modeled (unmeasured).
    chunked_head_copies: bool = False


@dataclass(frozen=True)
class MemoryBreakdown:
    weights: int
    adapters: int
    gradients: int
    optimizer_states: int
    activations: int
    logits_loss: int
    runtime_overhead: int
    # A 4-bit base's dequantized weight in the compute dtype (dequant_scratch_bytes), DeepSpeed ZeRO's buffers on
    # one GPU (zero_buffer_bytes): 0 where the run has none.
    dequant_scratch: int = 0
    zero_buffers: int = 0

    @property
    def total(self) -> int:
        return sum(asdict(self).values())

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def frozen_weight_bytes(arch: Arch, base_quant: str, compute_bytes: int, per_weight: float = NF4_BYTES) -> float:
    """The frozen base: a 4-bit base's block linears at `per_weight` bytes (nf4_bytes, gptq_bytes), int8's with a
    scale per output row, else the compute dtype; the rest (embedding, head, norms) in the compute dtype. An MoE
    model's routers stay in the compute dtype under either: transformers keeps each as a parameter of its router
    module, not a linear layer, which is all bitsandbytes quantizes (model/moe.py quantizes the experts only)."""
    routers = sum(m.params for m in arch.modules() if m.name == "router")
    blocks = arch.block_linear_params - routers
    rest = arch.total_params - blocks  # embedding, untied LM head, norms, routers: never quantized
    if base_quant == "nf4":
        block_bytes = blocks * per_weight
    elif base_quant == "int8":
        row_scales = sum(m.count * m.d_out for m in arch.modules() if m.name != "router")
        block_bytes = blocks * 1.0 + row_scales * 4.0
    else:
        block_bytes = blocks * compute_bytes
    return block_bytes + rest * compute_bytes


def trainable_params(arch: Arch, job: Job, s: Layout) -> int:
    if job.method.trains_base:
        return arch.total_params
    extra = 0
    if job.method.magnitude:  # one fp32 magnitude per output feature of each adapted matrix
        extra = sum(m.count * m.d_out for m in arch.modules() if m.name in s.targets)
    return adapter_params(arch, s.targets, job.adapter.lora.r) + extra + router_params(arch, job)


def router_params(arch: Arch, job: Job) -> int:
    """An MoE model's routers under `lora.router`: trained whole beside the adapter (fp32, with gradients and
    optimizer states); 0 otherwise."""
    if arch.moe is None or not job.adapter.lora.router or job.method.trains_base:
        return 0
    return sum(m.params for m in arch.modules() if m.name == "router")


def fp32_master(job: Job) -> bool:
    """Full fine-tuning with fp32 master weights: the embedding output, so the residual stream, is fp32, and
    autocast casts each weight to the compute dtype. With `weights: bf16` neither happens."""
    return job.method.trains_base and job.weight_bytes == 4


def kbit_prepared(job: Job) -> bool:
    """An HF script's quantized base after PEFT's prepare_model_for_kbit_training: the weights left unquantized
    (embedding, head, norms) are cast to fp32, so the embedding's output and the residual stream are fp32."""
    return job.hf is not None and job.hf.prepare_model_for_kbit_training and job.adapter.quant != "none"


def stream_bytes(job: Job, s: Layout) -> int:
    """Bytes per element of the residual stream: fp32 under full fine-tuning with fp32 master weights or a
    kbit-prepared HF base, else the compute dtype (frozen or bf16 weights are stored in it)."""
    return 4 if fp32_master(job) or kbit_prepared(job) else s.compute_bytes


def trained_shapes(arch: Arch, job: Job, s: Layout) -> list[tuple[int, int, int]]:
    """(rows, cols, how many) of the trained tensors: every weight under full fine-tuning (the block linears,
    the embedding and an untied head, the norms as vectors), else each adapter's A and B (and DoRA's magnitude)."""
    if job.method.trains_base:
        out = [(m.d_out, m.d_in, m.count) for m in arch.modules()]
        out.append((arch.vocab, arch.hidden, 1 if arch.tied else 2))
        vectors = arch.total_params - arch.block_linear_params - arch.vocab * arch.hidden * (1 if arch.tied else 2)
        return [*out, (max(vectors, 0), 1, 1)]
    r = job.adapter.lora.r
    out = []
    for m in arch.modules():
        if m.name not in s.targets:
            continue
        out += [(r, m.d_in, m.count), (m.d_out, r, m.count)]
        if job.method.magnitude:
            out.append((m.d_out, 1, m.count))
    if router_params(arch, job):
        out += [(m.d_out, m.d_in, m.count) for m in arch.modules() if m.name == "router"]
    return out


def optimizer_state_bytes(arch: Arch, job: Job, s: Layout) -> float:
    """The optimizer's state over every trained tensor (optimizers.Optimizer.state_bytes_of), and under
    `weights: bf16` with `bf16_update: kahan` a bf16 compensation buffer per weight."""
    row = job.optim
    if row.paged and s.offload_capable:
        # Paged states live in CUDA unified memory, outside the caching allocator's peak, and the driver moves
        # them to host memory under pressure (optimizers.Optimizer.paged): what the device must hold is the rest.
        return 0.0
    total = sum(n * row.state_bytes_of(rows, cols) for rows, cols, n in trained_shapes(arch, job, s))
    if job.parts.pure_bf16 and row.state_bytes >= 4:  # torch.optim's 32-bit states in the parameter's bf16
        total *= job.weight_bytes / 4
    if job.method.trains_base and job.weight_bytes == 2 and job.optimizer.bf16_update == "kahan":
        total += 2 * arch.total_params
    return total


def gradient_bytes(arch: Arch, job: Job, s: Layout, trainable: int) -> float:
    """The gradients alive at the peak (the start of the last backward, every activation alive). The whole buffer
    in the weights' dtype; with the step inside backward (optimizer_in_backward; a block's moment,
    backward_moments) each gradient is freed by its hook, so only the largest block tensor's is, plus a tied embedding's whole gradient, which autograd holds
    until the embedding adds its share at the end of backward. An untied head's gradient is the loss's
    (logits_bytes), stepped and freed first; an untied embedding's is made last, once the activations are freed.
    Plus the temporaries of the largest weight's step (step_temporary_bytes)."""
    if not job.optimizer.optimizer_in_backward:
        return trainable * job.weight_bytes
    block, tied = _held_in_backward(arch, job, s)
    return (block + tied) * job.weight_bytes + step_temporary_bytes(job, _largest_trained(arch, job, s))


def _largest_trained(arch: Arch, job: Job, s: Layout) -> int:
    """Values of the largest trained tensor, whose step allocates the most temporaries."""
    return max((rows * cols for rows, cols, _ in trained_shapes(arch, job, s)), default=0)


def _held_in_backward(arch: Arch, job: Job, s: Layout) -> tuple[int, int]:
    """(values of the largest block tensor, of a tied embedding): the gradients a block's moment holds with the
    step inside backward."""
    embedding = arch.vocab * arch.hidden if job.method.trains_base else 0
    block = max(rows * cols for rows, cols, _ in trained_shapes(arch, job, s) if rows * cols != embedding)
    return block, embedding if arch.tied else 0


# Bytes per value of a bf16 weight's piece while it steps (train/optim.PerParameter), measured
# (benchmarks/optimizers/step-memory_xeon-fp32-2c_2026-11-27.md): its fp32 value and gradient during the inner step
# (8); stochastic rounding then holds the value, its int32 noise and the bf16 result (10).
SHADOW_BYTES = 8
STOCHASTIC_BYTES = 10


def step_temporary_bytes(job: Job, values: int) -> float:
    """What one weight of `values` allocates while it steps: the optimizer's own scratch (Optimizer.step_scratch),
    and for bf16 weights the fp32 shadow, each over a piece of at most runtime.STEP_CHUNK values for an
    element-wise optimizer (optimizers.Optimizer.elementwise), the whole weight otherwise."""
    row = job.optim
    if job.weight_bytes != 2:
        return row.step_scratch * values
    piece = min(values, STEP_CHUNK) if row.elementwise else values
    shadow = STOCHASTIC_BYTES if job.optimizer.bf16_update == "stochastic" else SHADOW_BYTES
    return piece * (shadow + row.step_scratch)


def _adapter_bytes(arch: Arch, job: Job, s: Layout) -> float:
    """Per token and layer: each adapter's A output, and with dropout its keep mask and (eager blocks) the
    dropped copy of its input. DoRA runs peft's own layer, whose output (m/‖W + sBA‖ - 1)·base + m/‖W + sBA‖·s·BAx
    keeps the base product and the adapter's product (two d_out-wide tensors) for the trained magnitude's
    gradient: measured exactly eager; compiled blocks kept 63% of it on tests/unit/plan/test_plan_memory_saved.py's
    model, and plan stays above."""
    if job.method.trains_base:
        return 0.0
    # A token passes each adapted module `active / layers` times a layer (top_k times an expert kind).
    per = [(m.active / arch.layers, m) for m in arch.modules() if m.name in s.targets]
    adapted = [k * m.d_in for k, m in per]
    out = sum(k for k, _ in per) * s.compute_bytes * job.adapter.lora.r
    if job.method.magnitude:
        out += 2 * s.compute_bytes * sum(k * m.d_out for k, m in per)
    if job.adapter.lora.dropout > 0 and not job.compiled:
        out += sum(adapted) * (1 + s.compute_bytes)  # mask and dropped copy
    elif job.adapter.lora.dropout > 0 and s.dropout_mask_kept:
        out += sum(adapted)  # the mask; compiled blocks recompute the copy
    return out


def row_bytes_per_token_layer(arch: Arch, job: Job, s: Layout) -> float:
    """What a decoder layer saves per token outside attention's own tensors (docs/formulas.md, memory derivation),
    averaged over the layers; an MoE layer's MLP is the top_k experts' and the shared expert's width, plus the
    routing's own tensors (routing_bytes_per_token_layer)."""
    a, h, i = s.compute_bytes, arch.hidden, arch.mlp_width
    routing = routing_bytes_per_token_layer(arch, a)
    if job.compiled:
        return (
            stream_bytes(job, s) * h
            + a * arch.heads * arch.head_dim
            + 2 * a * i
            + 2 * 4
            + _adapter_bytes(arch, job, s)
            + routing
        )
    shapes = {m.name: (m.active / arch.layers * m.d_in, m.d_out) for m in arch.modules()}
    full = job.method.trains_base
    liger = job.hf is not None and job.hf.use_liger_kernel
    # HF's RMSNorm keeps its fp32 upcast input; Liger's keeps the input in the compute dtype (and a scalar per
    # row). Eager SwiGLU keeps gate, up and SiLU's output; Liger's recomputes SiLU in backward.
    norms = 2 * (a if liger else 4) * h * (2 if full else 1)
    mlp = (2 if liger else 3) * a * i
    master = fp32_master(job)
    groups = {
        "attn_in": ("q_proj", "k_proj", "v_proj"),
        "o": ("o_proj",),
        "mlp_in": ("gate_proj", "up_proj"),
        "down": ("down_proj",),
        "experts_in": ("experts.gate_up_proj",),
        "experts_down": ("experts.down_proj",),
        "shared_in": ("shared_expert.gate_proj", "shared_expert.up_proj"),
        "shared_down": ("shared_expert.down_proj",),
    }
    if master and a < 4:  # autocast casts each linear's fp32 input on its own
        inputs = a * sum(d_in for d_in, _ in shapes.values())
    elif job.hf is not None and not full and job.adapter.lora.dropout == 0:
        # PEFT casts each adapted module's input to its fp32 adapter's dtype and autocast casts it back: every
        # adapted linear keeps its own copy of its input for lora_A's gradient, not one per shared input.
        inputs = a * sum(shapes[t][0] for t in s.targets)
    elif (
        job.adapter.lora.dropout > 0
    ):  # adapters keep their dropped copies instead (_adapter_bytes); frozen linears nothing
        inputs = 0
    else:
        trained = set(shapes) if full else set(s.targets)
        inputs = a * sum(shapes[g[0]][0] for g in groups.values() if g[0] in shapes and set(g) & trained)
    return norms + mlp + inputs + _adapter_bytes(arch, job, s) + routing


def routing_bytes_per_token_layer(arch: Arch, compute_bytes: int) -> float:
    """What an MoE layer's routing saves per token, averaged over the layers: the router's logits and softmax in
    fp32 (2 x 4 B per expert), the top_k weights and indices (4 + 8 B each), and the top_k expert outputs before
    their weighted sum, kept for the routing weights' gradient (top_k x hidden). 0 for a dense model."""
    m = arch.moe
    if m is None:
        return 0.0
    per_sparse = 8 * m.experts + 12 * m.top_k + compute_bytes * m.top_k * arch.hidden
    return per_sparse * arch.sparse_layers / arch.layers


def attention_bytes_per_position(arch: Arch, job: Job, s: Layout) -> float:
    """What attention saves per query position and layer: q, k, v, its output, and the probabilities or
    SDPA's log-sum-exp (docs/formulas.md, memory derivation)."""
    a = s.compute_bytes
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    kept = a * arch.heads * s.slot_len if s.attention_probs else 4 * arch.heads
    if job.hf is not None and job.hf.attn_implementation != "flash_attention_2" and job.hf.padding_mask:
        # transformers' sdpa and eager paths with a padding mask repeat k and v to every query head (repeat_kv)
        # before the kernel, which keeps the repeated copies.
        kv = q
    if job.hf is not None and job.hf.eager_attention:
        # transformers' eager attention keeps softmax's fp32 output and its cast back for the product with V,
        # per head, over the row's whole (padded) width.
        kept = (4 + a) * arch.heads * s.row_len
    # The eager slot path's backward needs no output (its softmax correction comes from P and dP); compiled,
    # the partitioner keeps a hidden-sized tensor there, as SDPA and flex keep their output.
    outputs = 0 if s.attention_probs and not job.compiled else q
    if s.row_mask:
        # Whole rows under a mask: k and v repeated to every head (transformers' repeat_kv), and SDPA's output is
        # o_proj's input, one storage, where o_proj keeps its input (row_bytes_per_token_layer counts it).
        kv = q
        trained = job.method.trains_base or "o_proj" in s.targets
        outputs = 0 if trained and job.adapter.lora.dropout == 0 and not fp32_master(job) else q
    return a * (q + outputs + 2 * kv) + kept


# Layers whose saved activations are on the device at once under activation offloading (the module docstring).
OFFLOAD_LAYERS = 2


def _layer_bytes(arch: Arch, job: Job, s: Layout) -> tuple[float, float, float]:
    """(what one layer saves, one layer's input, the final norm's fp32 input), for one micro-batch."""
    tokens = job.batch.micro_batch * s.row_len
    positions = s.slots * s.slot_len if s.slots else tokens
    per_layer = (
        row_bytes_per_token_layer(arch, job, s) * tokens
        + attention_bytes_per_position(arch, job, s) * positions
        + s.compute_bytes * s.row_mask * s.row_len**2  # SDPA's mask in the compute dtype (Layout.row_mask)
    )
    return per_layer, stream_bytes(job, s) * arch.hidden * tokens, 4 * arch.hidden * tokens


def activation_bytes(arch: Arch, job: Job, s: Layout, recomputed: bool = True) -> float:
    """Saved activations of one micro-batch; `recomputed=False`: before backward recomputes a checkpointed layer."""
    per_layer, layer_input, residual = _layer_bytes(arch, job, s)
    every = job.parts.ckpt_every if job.compute.grad_ckpt else 0
    return checkpointed_bytes(arch.layers, per_layer, layer_input, every, s.offload, recomputed) + residual


def checkpointed_bytes(
    layers: int, per_layer: float, layer_input: float, every: int, offloaded: bool, recomputed: bool = True
) -> float:
    """The decoder layers' saved activations under each checkpointing variant: none (`every` 0: every layer keeps
    what it saves), full (`every` 1: each layer keeps its input, one layer is recomputed at a time), selective
    (one layer in every `every` checkpointed, torchtune's ac_option: layers // every keep their input, the rest
    everything), each offloaded (the kept tensors on the host, OFFLOAD_LAYERS layers' on the device in flight)."""
    checkpointed = layers // every if every else 0
    plain = layers - checkpointed
    if offloaded:  # the host holds them; the device the layers in flight
        checkpointed, plain = min(checkpointed, OFFLOAD_LAYERS), min(plain, OFFLOAD_LAYERS)
    return checkpointed * layer_input + plain * per_layer + (per_layer if recomputed and checkpointed else 0)


def offloaded_bytes(arch: Arch, job: Job, s: Layout) -> float:
    """Pinned host memory that activation offloading holds at the peak: the saved activations (or, with gradient
    checkpointing, the layer inputs) of every layer, each copied out as its forward ends."""
    if not s.offload:
        return 0.0
    per_layer, layer_input, _ = _layer_bytes(arch, job, s)
    every = job.parts.ckpt_every if job.compute.grad_ckpt else 0
    checkpointed = arch.layers // every if every else 0
    return checkpointed * layer_input + (arch.layers - checkpointed) * per_layer


def max_seq_len(arch: Arch, job: Job, s: Layout, capacity: int, loss_per_position: float, limit: int = 1 << 22) -> int:
    """Largest seq_len, a multiple of 128 (FlexAttention's block), whose predicted peak fits in `capacity`
    bytes with rows packed full (the widest row is seq_len; `loss_per_position` of its positions have loss);
    0 when not even 128 fits. Peak grows with the row, so a binary search suffices. Attention over whole
    rows only (flex, sdpa, flash): per-sequence slots depend on the documents, not the row."""
    from dataclasses import replace

    def fits(blocks: int) -> bool:
        t = blocks * 128
        rows = max(1, round(loss_per_position * t * job.batch.micro_batch))
        return breakdown(arch, job, replace(s, row_len=t, loss_rows=rows, slots=0, slot_len=0)).total <= capacity

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


def logits_bytes(arch: Arch, job: Job, s: Layout) -> float:
    """The loss's own memory at its peak, inside the forward (docs/formulas.md, memory derivation). A stack with
    whole-vocabulary logits (Job.whole_vocab_logits) holds, for every fed position at once, the head's logits in the compute
    dtype, their fp32 upcast and cross-entropy's fp32 log-probabilities saved for backward (a + 4 + 4 bytes a
    logit), and at backward's start three fp32 tensors a logit (15 GB for a 152k vocabulary at 8,192
    positions)."""
    a = s.compute_bytes
    kind = loss_kernel(job)
    # transformers' loss and torchtune's chunked output take every fed position's logits, targets or not
    positions = job.batch.micro_batch * s.row_len if kind in ("whole", "chunked_output", "native") else s.loss_rows
    copies = job.batch.micro_batch if s.chunked_head_copies else 0
    out = loss_kernel_bytes(kind, positions, arch.vocab, arch.hidden, a, s.loss_chunk, job.compiled, copies)
    if arch.logit_softcap:
        out += 3 * 4 * s.loss_chunk * arch.vocab
    if job.method.trains_base:
        out += head_gradient_bytes(arch, job, s)
    return out


def loss_kernel(job: Job) -> str:
    """The job's loss kernel: another tool's (Job.parts), else the HF spec's, else tunelab's chunked head."""
    if job.parts.loss_kernel:
        return job.parts.loss_kernel
    return job.hf.loss_kernel if job.hf is not None else "chunked"


def loss_kernel_bytes(
    kind: str,
    positions: float,
    vocab: int,
    hidden: int,
    a: int,
    chunk: int,
    compiled: bool = False,
    head_copies: int = 0,
) -> float:
    """The loss kernel's own bytes at its peak over `positions` rows of a `vocab`-wide head in `a`-byte values
    (docs/formulas.md, "The loss kernels"):
    - whole: transformers' ForCausalLMLoss; backward starts with three fp32 tensors a logit (the saved
      log-probabilities, NLL's gradient and log_softmax's), 12 B, more than the forward's a + 8 in bf16;
    - chunked: tunelab's gathered head (and torchtune's LinearCrossEntropyLoss): `chunk` rows of logits in the
      compute dtype and fp32 at once, plus the head's input and its gradient;
    - liger: Liger's fused linear cross-entropy, whose chunk is the next power of two of positions / (vocab /
      hidden) rows (so about positions x hidden values of logits), in the compute dtype and fp32, plus the input
      and its gradient;
    - cce: Cut Cross Entropy computes the logits block by block in on-chip memory and never stores them: the
      input and its gradient only;
    - chunked_output: torchtune's CEWithChunkedOutputLoss: the model returns every logit in the compute dtype (in
      8 chunks) and keeps them for the loss's backward; eager, each chunk's fp32 upcast is freed but its fp32
      log-probabilities are saved (4 B a logit, one chunk's upcast at a time); compiled (torchtune compiles
      compute_cross_entropy), the upcast and log-softmax fuse into the reduction and only one chunk's gradient
      in the compute dtype is made at a time; where the head's matmul over a chunk copies the head weight
      (`head_copies`: the micro-batch's rows on a CPU), those copies are alive with every chunk's logits in the
      forward and beside one chunk's gradient in backward (compiled), the larger of that and the loss's (eager);
    - native: torch's cross-entropy over every logit in the compute dtype (torchtune's torch.nn.CrossEntropyLoss):
      eager, the logits, the saved log-probabilities and at backward's start their gradient (3 a a logit);
      compiled, the log-probabilities are recomputed (2 a)."""
    inputs = 2 * positions * hidden * a
    if kind == "whole":
        return positions * vocab * max(a + 8.0, 12.0)
    if kind == "chunked":
        return chunk * vocab * (4 + a) + inputs
    if kind == "liger":
        rows = min(positions, 2 ** math.ceil(math.log2(max(1.0, math.ceil(positions / math.ceil(vocab / hidden))))))
        return rows * vocab * (4 + a) + inputs
    if kind == "cce":
        return inputs
    if kind == "chunked_output":
        copies = head_copies * vocab * hidden * a
        if compiled:
            return positions * vocab * a + positions / 8 * vocab * a + copies + inputs
        return max(positions * vocab * (a + 4) + positions / 8 * vocab * 4, positions * vocab * a + copies) + inputs
    if kind == "native":
        return positions * vocab * a * (2 if compiled else 3)
    raise ValueError(f"loss kernel {kind!r}: one of {', '.join(LOSS_KERNELS)}")


def head_gradient_bytes(arch: Arch, job: Job, s: Layout) -> float:
    """A trained head's own memory in the loss, the larger of two moments that do not overlap: the forward's cast
    of the head to the compute dtype (when the dtypes differ), freed with the forward's last chunk, and backward's
    gradient in the weights' dtype (train/loss.head_weight_grad) with one vocabulary slice's cast and, when the
    weights are wider than the compute dtype, its product before it is widened. No fp32 sum: each slice's sum over
    the rows accumulates inside its matmul; the slice's logits reuse the forward chunk's buffers (logits_bytes)."""
    a, w = s.compute_bytes, job.weight_bytes
    cast = a if a != w and s.sharding != "zero3" else 0
    slice_values = min(arch.vocab, s.loss_chunk * arch.vocab / max(1, s.loss_rows)) * arch.hidden
    backward = arch.vocab * arch.hidden * w + slice_values * (cast + (a if a < w else 0))
    return max(arch.vocab * arch.hidden * cast, backward)


def reference_bytes(arch: Arch, job: Job, s: Layout) -> tuple[float, float]:
    """(weights, activations) that DPO's reference adds: a frozen copy of a fully trained model in its fp32
    master dtype (none with the adapter disabled, or once a precomputed table replaces it), and the reference
    forward's transient, run without gradients after the policy's forward: one layer's activations of the
    micro-batch and the summed log-probs, while every policy activation is still alive."""
    weights = arch.total_params * job.weight_bytes if s.reference_copy else 0.0
    transient = (
        row_bytes_per_token_layer(arch, job, s) * job.batch.micro_batch * s.row_len if s.reference_forward else 0.0
    )
    return weights, transient


@dataclass(frozen=True)
class Moment:
    """The transient bytes alive together at one moment of a step (weights, states and overhead aside)."""

    name: str
    activations: float
    gradients: float
    logits_loss: float

    @property
    def total(self) -> float:
        return self.activations + self.gradients + self.logits_loss


def loss_scratch_bytes(arch: Arch, s: Layout) -> float:
    """The loss's chunk logits in the compute dtype and fp32 (train/loss._scratch): kept across steps, so alive at
    every moment."""
    return s.loss_chunk * arch.vocab * (4 + s.compute_bytes)


def backward_moments(arch: Arch, job: Job, s: Layout, trainable: int) -> tuple[Moment, ...]:
    """With the step inside backward, the moments whose transients coexist (docs/formulas.md, "the step in
    backward: a peak per moment"). The loss's: its forward or backward with every saved activation but no layer
    recomputed yet, the head's gradient made and (untied) stepped in its hook, which autograd runs as soon as it is
    ready. A block's: one layer recomputed, its largest gradient and step, a tied head's gradient still held, the
    loss's scratch. A trained embedding's, at backward's end: its gradient (a tied one's two shares summed) and
    step, beside one hidden-sized gradient of the micro-batch."""
    head = arch.vocab * arch.hidden if job.method.trains_base else 0
    untied_head = 0 if arch.tied else head
    loss = Moment(
        "loss",
        activation_bytes(arch, job, s, recomputed=False),
        step_temporary_bytes(job, untied_head) if untied_head else 0.0,
        logits_bytes(arch, job, s),
    )
    scratch = loss_scratch_bytes(arch, s)
    held, tied = _held_in_backward(arch, job, s)  # only block weights step here: the largest one's temporaries
    gradients = (held + tied) * job.weight_bytes + step_temporary_bytes(job, held)
    block = Moment("block", activation_bytes(arch, job, s), gradients, scratch)
    if not head:
        return loss, block
    _, layer_input, _ = _layer_bytes(arch, job, s)
    shares = 2 if arch.tied else 1
    embedding = Moment(
        "embedding", layer_input, shares * head * job.weight_bytes + step_temporary_bytes(job, head), scratch
    )
    return loss, block, embedding


def fresh_gradient_moments(arch: Arch, job: Job, s: Layout, trainable: int) -> tuple[Moment, ...]:
    """With one micro-batch a step and the step after backward, the moments whose transients coexist (docs/formulas.md,
    "one micro-batch a step: gradients replace activations"). No gradient is held at backward's start (the loop frees
    them, train/loop: zero_grad(set_to_none=True)), and backward makes them as it frees the activations, so the peak
    is the larger of its start and its end. The loss's: every saved activation, no layer recomputed, the loss's
    memory with the head's gradient. The first block's: one layer recomputed, the head's gradient held, the loss's
    scratch. The end's: every gradient, one hidden-sized tensor of the micro-batch, the scratch, and the step's
    temporaries of the largest weight."""
    loss = Moment("loss", activation_bytes(arch, job, s, recomputed=False), 0.0, logits_bytes(arch, job, s))
    scratch = loss_scratch_bytes(arch, s)
    head = arch.vocab * arch.hidden * job.weight_bytes if job.method.trains_base else 0
    block = Moment("block", activation_bytes(arch, job, s), head, scratch)
    _, layer_input, _ = _layer_bytes(arch, job, s)
    gradients = trainable * job.weight_bytes + step_temporary_bytes(job, _largest_trained(arch, job, s))
    return loss, block, Moment("gradients", layer_input, gradients, scratch)


def moments_apply(job: Job, s: Layout) -> bool:
    """Where the code guarantees the moments: tunelab's own loop (not an HF stack's whole-vocabulary loss), one
    process (sharding adds buckets and gathers the moments do not model), and either the step inside backward or
    one micro-batch a step (no gradient held from an earlier one)."""
    fresh = job.batch.grad_accum == 1
    return (job.optimizer.optimizer_in_backward or fresh) and job.hf is None and s.sharding == "single"


def breakdown(arch: Arch, job: Job, s: Layout) -> MemoryBreakdown:
    """Peak memory per process (per GPU when sharded): everything alive at the start of the last backward
    of an optimizer step, when all activations and the logits are alive and the states exist; with the step
    inside backward or one micro-batch a step, the largest of the moments whose transients coexist
    (backward_moments, fresh_gradient_moments)."""
    trainable = trainable_params(arch, job, s)
    if job.method.trains_base:
        weights = arch.total_params * job.weight_bytes
        if fp32_master(job) and s.compute_bytes < 4 and s.sharding != "zero3":
            # autocast's cached 16-bit copies of the block weights (docs/formulas.md, memory derivation)
            embedding_and_head = arch.vocab * arch.hidden * (1 if arch.tied else 2)
            weights += (arch.total_params - embedding_and_head) * s.compute_bytes
        adapters = 0
    else:
        weights = frozen_weight_bytes(arch, job.adapter.quant, s.compute_bytes, four_bit_bytes(job))
        if kbit_prepared(job):  # the unquantized rest in fp32 (kbit_prepared)
            weights += (arch.total_params - arch.block_linear_params) * (4 - s.compute_bytes)
        adapters = trainable * (job.weight_bytes if job.parts.pure_bf16 else TRAINABLE_BYTES)
    grads = gradient_bytes(arch, job, s, trainable)
    states = optimizer_state_bytes(arch, job, s)
    world = max(1, s.world)
    if s.sharding == "ddp":
        grads *= 2  # DDP's flat all-reduce buckets copy the gradients
    elif s.sharding == "zero2":
        grads, states = grads / world, states / world
    elif s.sharding == "zero3":
        # FSDP2 gathers in the compute dtype (plan/comm.py), full fine-tuning's fp32 master weights included.
        gathered = (arch.block_linear_params / arch.layers + root_params(arch)) * s.compute_bytes
        if job.method.trains_base:
            weights = weights / world + gathered
        else:
            weights, adapters = weights / world + gathered, adapters / world
        # Full fine-tuning's whole LM-head gradient, made by the loss (logits_bytes), waits for the root's
        # reduce-scatter at the end of backward.
        grads, states = grads / world, states / world
    ref_weights, ref_transient = reference_bytes(arch, job, s)
    peak = Moment("all at once", activation_bytes(arch, job, s), grads, logits_bytes(arch, job, s))
    if moments_apply(job, s):
        # the transients that never coexist: the largest moment, not their sum
        moments = backward_moments if job.optimizer.optimizer_in_backward else fresh_gradient_moments
        peak = max(moments(arch, job, s, trainable), key=lambda m: m.total)
    return MemoryBreakdown(
        weights=round(weights + ref_weights),
        adapters=round(adapters),
        gradients=round(peak.gradients),
        optimizer_states=round(states),
        activations=round(peak.activations + ref_transient),
        logits_loss=round(peak.logits_loss),
        runtime_overhead=max(0, s.runtime_overhead - (s.pages_returned_before_step if peak.name == "gradients" else 0)),
        dequant_scratch=round(dequant_scratch_bytes(arch, s.compute_bytes)) if job.adapter.quant == "nf4" else 0,
        zero_buffers=round(
            zero_buffer_bytes(job.parts.zero_stage, trainable, arch.total_params, s.compute_bytes, job.weight_bytes)
            if s.world == 1
            else 0
        ),
    )


def host_load_bytes(arch: Arch, job: Job, s: Layout) -> float:
    """CPU memory that loading the model takes in a process that reads the weights before FSDP shards them
    (train/distributed.shard): every weight in the compute dtype as read (frozen bases stay in it, adapters are
    small), and under full fine-tuning in fp32, the master weights' dtype, to which the weights are converted
    one tensor at a time before sharding (model/adapters.apply_adapter), so 4 B per parameter at the peak. With
    fsdp_cpu_ram_efficient_loading (configs/accelerate/fsdp2.yaml) only the main process holds this; without,
    every process does."""
    per = 4 if job.method.trains_base else s.compute_bytes
    return arch.total_params * per


def root_params(arch: Arch) -> int:
    """The root unit of tunelab's FSDP (train/distributed.shard): embeddings, final norm and an untied LM head,
    gathered for the whole step, as the fused loss reads the head's weight outside the head's own forward."""
    return arch.total_params - arch.block_linear_params - 2 * arch.layers * arch.hidden


def max_micro_batch(arch: Arch, job: Job, s: Layout, capacity: int, loss_per_row: float, limit: int = 4096) -> int:
    """Largest micro-batch whose predicted peak fits in `capacity` bytes (0 when not even 1 fits).
    Peak grows monotonically with the micro-batch, so a binary search suffices."""
    from dataclasses import replace

    def fits(b: int) -> bool:
        slots = round(s.slots * b / job.batch.micro_batch)  # slots grow with the rows packed into a micro-batch
        mask = b if s.row_mask > 1 else s.row_mask  # a packed row's block-diagonal mask each
        trial = replace(s, loss_rows=max(1, round(loss_per_row * b)), slots=slots, row_mask=mask)
        return breakdown(arch, job.but(micro_batch=b), trial).total <= capacity

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
