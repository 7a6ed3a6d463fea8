"""Mixture-of-Experts blocks in training: the experts as grouped matrix products over tokens sorted by expert,
LoRA on the stacked expert weights fused into those products, and the router's load-balancing loss.

transformers 5.25 stores each sparse block's experts stacked (`experts.gate_up_proj` [E, 2I, H] and
`experts.down_proj` [E, H, I]; gpt-oss transposed, [E, H, 2I] / [E, I, H], with biases and its own gate) and
dispatches the experts' forward through its ExpertsInterface. tunelab registers one more implementation there
(`NAME`) and sets it on every MoE model it loads (`use_grouped`), so one function serves every family:

- the (token, expert) pairs are sorted by expert once per block; each projection is one `torch._grouped_mm` over
  the sorted rows (per-expert contiguous segments, one matmul each, where the device has no grouped kernel), never
  a loop over tokens;
- LoRA on the experts is PEFT's `target_parameters` (its ParamWrapper, so the adapter saves and loads as PEFT's),
  but its forward is not PEFT's: PEFT parametrizes the whole expert stack, W + B·A for every expert, every forward,
  and backpropagates a gradient the size of the stack into the low-rank factors. Here each projection's
  low-rank path is two more grouped products over the same sorted rows (x·Aₑᵀ, then ·Bₑᵀ), added to the base
  product, and the frozen stack gets no gradient at all (`fuse_lora`);
- QLoRA: bitsandbytes quantizes linear layers only, so a 4-bit base leaves the stacked experts in 16 bits.
  `quantize_experts` puts each expert's slice of each stack in NF4 (bitsandbytes' own blockwise quantizer, the
  dense QLoRA layers' block of 64 and double quantization), and the grouped forward dequantizes one expert at a
  time for its segment's product (again in backward), never the whole stack;
- the router's auxiliary load-balancing loss is transformers' own function of the family (`aux_loss`), over the
  real tokens of a packed batch, weighted by `router_aux_loss_coef` when the config's `output_router_logits` asks
  for it, as transformers adds it.
"""

from __future__ import annotations

import importlib
import types

import torch

from .. import families

NAME = "tunelab_grouped"
EXPERT_PARAMS = ("gate_up_proj", "up_proj", "down_proj")  # the stacked projections LoRA can target


def is_moe(config) -> bool:
    return families.experts(config) is not None


def register() -> str:
    """tunelab's grouped experts forward as a transformers experts implementation; returns its name."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if NAME not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(NAME, grouped_experts_forward)
    return NAME


def use_grouped(model: torch.nn.Module) -> None:
    """Run `model`'s experts through tunelab's grouped forward (a no-op on a dense model)."""
    if not is_moe(model.config):
        return
    model.set_experts_implementation(register())


def experts_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of each stacked experts module (the base module under any PEFT wrapper)."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if any(
            isinstance(getattr(module, p, None), torch.nn.Parameter) and getattr(module, p).dim() == 3
            for p in EXPERT_PARAMS
        )
        and hasattr(module, "num_experts")
    ]


def router_modules(model: torch.nn.Module) -> list[str]:
    """Leaf names of the routers (transformers' `*TopKRouter` modules: `gate`, or gpt-oss's `router`)."""
    return sorted({name.split(".")[-1] for name, m in model.named_modules() if type(m).__name__.endswith("TopKRouter")})


def expert_params(model: torch.nn.Module) -> list[str]:
    """The stacked expert parameters as PEFT's `target_parameters` names them (`experts.gate_up_proj`)."""
    names = set()
    for name, module in experts_modules(model):
        leaf = name.split(".")[-1]
        for p in EXPERT_PARAMS:
            if isinstance(getattr(module, p, None), torch.nn.Parameter):
                names.add(f"{leaf}.{p}")
    return sorted(names)


# --- the grouped forward ---------------------------------------------------------------------------------------


def _grouped_kernel(x: torch.Tensor) -> bool:
    """Whether the products run as torch's grouped kernel: CUDA with SM80+ in bf16. On the CPU torch 2.9+ has a
    `_grouped_mm` too, but it is a loop of matmuls slower than `Segments`' own (half the speed on a 2-core EPYC
    at 64 experts, and a tenth on LoRA's rank-16 products: benchmarks/peers/moe-peers_…_2026-12-07.md)."""
    if not hasattr(torch, "_grouped_mm") or x.device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(x.device) >= (8, 0) and x.dtype == torch.bfloat16


def grouped_mm(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Rows of `x` (S, in), sorted by expert with `offs` the cumulative counts, times their expert's slice of
    `weight` (E, in, out), as torch's grouped kernel (with its autograd)."""
    return torch._grouped_mm(x, weight.to(x.dtype), offs=offs)


TILE_MIN, TILE_MAX = 16, 32  # rows per tile of LoRA's batched products: half the mean expert load, in this range


def rounded(n: int) -> int:
    """n rounded up to 16 sizes per power of two (at most 1/16 more): Segments.mm's product sizes."""
    step = 1 << max(0, n.bit_length() - 5)
    return -(-n // step) * step


class Segments:
    """The sorted rows' per-expert segments, and the products over them where no grouped kernel runs. The rows live
    in tiles from dispatch to combine: each expert's rows start a tile of `tile` rows and run on to a whole number
    of tiles, the padding rows zero, so LoRA's rank-r products are batched matmuls over views of the activations
    (each tile with its expert's factors: one call instead of E thin ones, which cost more in call overhead than in
    arithmetic), the low-rank output added in place into the base product's (baddbmm_), with no copy into or out of
    tiles either way; a dense projection is one matmul per expert's segment, written in place. Padding costs less
    than a tile per expert however skewed the routing; the tile is capped at 32 rows (a 64-row tile at 64 experts,
    top-8 carried 27% padding rows through every elementwise op, for no faster products)."""

    def __init__(self, expert_ids: torch.Tensor, counts: torch.Tensor, num: int):
        self.num, self.real = num, expert_ids.numel()
        self.counts = counts.tolist()
        half_mean = -(-self.real // (2 * num))
        self.tile = min(TILE_MAX, max(TILE_MIN, -(-half_mean // TILE_MIN) * TILE_MIN))
        tiles = (counts + self.tile - 1) // self.tile
        first = tiles.cumsum(0) - tiles  # each expert's first tile
        self.tiles = int(tiles.sum())
        self.rows = self.tiles * self.tile  # the padded rows every activation of the block holds
        self.starts = (first * self.tile).tolist()
        self.tile_expert = torch.repeat_interleave(torch.arange(num, device=counts.device), tiles)
        rank = torch.arange(self.real, device=expert_ids.device) - (counts.cumsum(0) - counts)[expert_ids]
        self.pos = first[expert_ids] * self.tile + rank  # each sorted row's row in tiles
        padding = torch.ones(self.rows, dtype=torch.bool, device=counts.device)
        padding[self.pos] = False
        self.padding = padding.nonzero().squeeze(1)  # the tiles' rows past each expert's own

    def spans(self):
        """(expert, first row, end of its real rows) of each expert with rows, in the tiled layout."""
        for e, (n, a) in enumerate(zip(self.counts, self.starts)):
            if n:
                yield e, a, a + n

    def row_expert(self) -> torch.Tensor:
        """Each tiled row's expert (padding rows their tile's): (rows,)."""
        return self.tile_expert.repeat_interleave(self.tile)

    def mm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Each segment of x (rows, in) times its expert's w (E, in, out): (rows, out), the padding rows zero. Each
        product runs over its rows rounded up to a few sizes (`rounded`), into its padding and the next experts'
        rows, which their own products, run after, overwrite: oneDNN builds and caches a kernel per matrix shape,
        and with the expert loads changing every step, exact row counts made new shapes every step (16-27 ms a
        0.28 s step of kernel creation at 64 experts, top-8) and more shapes than its cache holds (1024) in a long
        run. The padding is zero-filled after (only those rows: a fill of the whole buffer cost more)."""
        rows = x.shape[0]
        out = x.new_empty(rows, w.shape[-1])
        for e, a, b in self.spans():
            end = min(a + rounded(b - a), rows)
            torch.mm(x[a:end], w[e], out=out[a:end])
        return out.index_fill_(0, self.padding, 0)

    def tn(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per expert x_eᵀ·y_e over its segment: (E, x's width, y's width) (zero for an expert with no rows)."""
        out = x.new_zeros(self.num, x.shape[-1], y.shape[-1])
        for e, a, b in self.spans():
            torch.mm(x[a:b].t(), y[a:b], out=out[e])
        return out

    def tiled(self, t: torch.Tensor) -> torch.Tensor:
        """(rows, d) as its tiles (tiles, tile, d), a view."""
        return t.view(self.tiles, self.tile, t.shape[-1])

    def per_expert(self, t: torch.Tensor) -> torch.Tensor:
        """(tiles, ...) summed per expert: (E, ...)."""
        return t.new_zeros(self.num, *t.shape[1:]).index_add_(0, self.tile_expert, t)

    def lora(self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float, out: torch.Tensor):
        """Adds scale·(x·Aₑ)·Bₑ per row into `out` (rows, out) in place; returns x·Aₑ per tile (tiles, tile, r) for
        the backward. The scale is the in-place product's own factor (alpha), so no scaled copy of Bₑ is made."""
        h = torch.bmm(self.tiled(x), self.per_tile(a.transpose(1, 2)).transpose(1, 2))
        self.tiled(out).baddbmm_(h, self.per_tile(b), alpha=scale)
        return h

    def per_tile(self, t: torch.Tensor) -> torch.Tensor:
        """(E, ...) as each tile's expert's slice (tiles, ...): index_select's whole-slice copies, where indexing a
        transposed view gathered element by element."""
        return t.index_select(0, self.tile_expert)

    def lora_backward(self, x, a, b, h, dy, scale, dx):
        """dA, dB of `lora` for dy (rows, out), adding dx's low-rank part into `dx` in place when given."""
        dyt = self.tiled(dy)
        dh = torch.bmm(dyt, self.per_tile(b).transpose(1, 2)).mul_(scale)
        db = self.per_expert(torch.bmm(h.transpose(1, 2), dyt)).mul_(scale)
        if dx is not None:
            self.tiled(dx).baddbmm_(dh, self.per_tile(a.transpose(1, 2)))
        return self.per_expert(torch.bmm(self.tiled(x).transpose(1, 2), dh)), db


class _SegmentedLinear(torch.autograd.Function):
    """y = x·Wₑ + scale·(x·Aₑ)·Bₑ over the tiled rows (Segments), each row by its expert e, with the backward
    written out: dx from the frozen stack's products, dA and dB from rank-r ones, and the stack's own gradient only
    when it trains (full fine-tuning). The inputs arrive in one dtype; autocast stays out of the in-place products.
    The padding rows of x and of the output's gradient are zero (dispatch and combine write them so), so they add
    nothing to dA, dB or the stack's gradient."""

    @staticmethod
    def forward(ctx, x, weight, a, b, scale, seg):
        with torch.autocast(x.device.type, enabled=False):
            out = seg.mm(x, weight)
            h = seg.lora(x, a, b, scale, out) if a is not None else None
        ctx.seg, ctx.scale = seg, scale
        dense = isinstance(weight, torch.Tensor)  # else 4-bit experts (Dequantized), dequantized again in backward
        ctx.stack = None if dense else weight
        keep_x = weight.requires_grad or a is not None  # for the stack's gradient (full fine-tuning) or LoRA's dA
        ctx.save_for_backward(x if keep_x else None, weight if dense else None, a, b, h)
        return out

    @staticmethod
    def backward(ctx, dy):
        x, weight, a, b, h = ctx.saved_tensors
        weight = ctx.stack if ctx.stack is not None else weight
        seg, scale = ctx.seg, ctx.scale
        with torch.autocast(dy.device.type, enabled=False):
            dy = dy.contiguous().to(weight.dtype)
            dx = seg.mm(dy, weight.transpose(1, 2)) if ctx.needs_input_grad[0] else None
            dw = seg.tn(x, dy) if ctx.needs_input_grad[1] else None
            da = db = None
            if a is not None:
                da, db = seg.lora_backward(x, a, b, h, dy, scale, dx)
        return dx, dw, da, db, None, None


class _Dispatch(torch.autograd.Function):
    """Each token's row once per expert it is routed to, in the experts' tiled order (Segments): hidden[row_token],
    the padding rows zero. Its gradient gathers each (token, slot)'s row back (`slot_row`) and sums each token's k
    rows, instead of autograd's accumulating index_put, which a CPU runs serially (3 ms of a 0.3 s step per layer
    at 64 experts, top-8)."""

    @staticmethod
    def forward(ctx, hidden, row_token, slot_row, padding, top_k):
        ctx.save_for_backward(slot_row)
        ctx.top_k = top_k
        return hidden.index_select(0, row_token).index_fill_(0, padding, 0)

    @staticmethod
    def backward(ctx, grad):
        (slot_row,) = ctx.saved_tensors
        per_slot = grad.index_select(0, slot_row)
        return per_slot.view(-1, ctx.top_k, grad.shape[-1]).sum(1), None, None, None, None


class _Combine(torch.autograd.Function):
    """The tiled rows back in (token, slot) order, rows[slot_row]; the gradient is a gather too (`row_slot`), with
    the padding rows zero."""

    @staticmethod
    def forward(ctx, rows, slot_row, row_slot, padding):
        ctx.save_for_backward(row_slot, padding)
        return rows.index_select(0, slot_row)

    @staticmethod
    def backward(ctx, grad):
        row_slot, padding = ctx.saved_tensors
        return grad.index_select(0, row_slot).index_fill_(0, padding, 0), None, None, None


def _projection(experts, name: str, x, offs, seg, row_expert):
    """One stacked projection of the sorted rows: base product, its LoRA product when adapted, its bias."""
    stack = getattr(experts, "tunelab_nf4", {}).get(name)
    if stack is not None:  # 4-bit experts: the segment path, one expert dequantized at a time
        oriented = Dequantized(stack, x.dtype, not experts.is_transposed)
    else:
        weight = getattr(experts, name)
        oriented = weight if experts.is_transposed else weight.transpose(1, 2)  # (E, in, out)
    lora = getattr(experts, "tunelab_lora", {}).get(name)
    factors = lora_factors(lora) if lora is not None else None
    if seg is None:  # the grouped kernel, autograd through it
        out = grouped_mm(x, oriented, offs)
        if factors is not None:
            a, b, scale = factors  # (E, in, r), (E, r, out)
            out = out + grouped_mm(grouped_mm(x, a, offs), b, offs) * scale
    else:
        a, b, scale = factors if factors is not None else (None, None, 1.0)
        a, b = (None, None) if a is None else (a.to(x.dtype), b.to(x.dtype))
        dense = oriented.to(x.dtype) if stack is None else oriented
        out = _SegmentedLinear.apply(x, dense, a, b, scale, seg)
    bias = getattr(experts, f"{name}_bias", None) if experts.has_bias else None
    if bias is not None:
        out = out + bias.to(out.dtype)[row_expert]
    return out


def grouped_experts_forward(experts, hidden_states, top_k_index, top_k_weights):
    """The experts' output for each token (transformers' experts-forward signature): every (token, expert) pair
    sorted by expert, each projection one grouped product over the sorted rows, the outputs weighted by the
    router and summed back per token."""
    tokens, top_k = top_k_index.shape
    flat = top_k_index.reshape(-1)
    expert_ids, order = torch.sort(flat, stable=True)
    num = experts.num_experts
    counts_t = torch.bincount(flat, minlength=num)
    offs = counts_t.cumsum(0).to(torch.int32)
    grouped = _grouped_kernel(hidden_states) and not getattr(experts, "tunelab_nf4", None)
    seg = None if grouped else Segments(expert_ids, counts_t, num)
    if grouped:
        x, row_expert = hidden_states[order // top_k], expert_ids
    else:  # the rows gathered into tiles, and in combine gathered back, as gathers both ways (_Dispatch, _Combine)
        row_slot = torch.zeros(seg.rows, dtype=order.dtype, device=order.device).index_copy_(0, seg.pos, order)
        slot_row = torch.empty_like(order).index_copy_(0, order, seg.pos)  # each (token, slot)'s tiled row
        x = _Dispatch.apply(hidden_states, row_slot // top_k, slot_row, seg.padding, top_k)
        row_expert = seg.row_expert() if experts.has_bias else None
    up = _projection(experts, "gate_up_proj" if experts.has_gate else "up_proj", x, offs, seg, row_expert)
    act = experts._apply_gate(up) if experts.has_gate else experts.act_fn(up)
    down = _projection(experts, "down_proj", act, offs, seg, row_expert)
    if not grouped:  # back to (token, slot) order, weighted and summed over each token's k rows
        per_slot = _Combine.apply(down, slot_row, row_slot, seg.padding).view(tokens, top_k, -1)
        out = (per_slot * top_k_weights.unsqueeze(-1).to(down.dtype)).sum(1)
        return out.to(hidden_states.dtype)
    weighted = down * top_k_weights.reshape(-1)[order].unsqueeze(-1).to(down.dtype)
    out = torch.zeros(tokens, weighted.shape[-1], dtype=weighted.dtype, device=weighted.device)
    out.index_add_(0, order // top_k, weighted)
    return out.to(hidden_states.dtype)


# --- 4-bit experts (QLoRA) ------------------------------------------------------------------------------------

NF4_BLOCK = 64  # weights a block shares one absmax: bitsandbytes' Linear4bit default, what load.py's dense layers get


class NF4Stack:
    """One stacked projection (E, a, b) with each expert's slice in bitsandbytes NF4, double-quantized as the dense
    QLoRA layers (model/load.py), quantized and dequantized by bitsandbytes' own functions. Each expert is quantized
    flat: bitsandbytes 0.50.2's CPU dequantize_4bit misplaces the blocks of a 2-D weight whose rows are not a
    multiple of the block (a (48, 32) weight comes back with every block after the first wrong)."""

    def __init__(self, weight: torch.Tensor):
        from bitsandbytes.functional import quantize_4bit

        self.num, self.shape, self.dtype = weight.shape[0], tuple(weight.shape[1:]), weight.dtype
        self.experts = [
            quantize_4bit(
                weight[e].reshape(-1).contiguous(),
                blocksize=NF4_BLOCK,
                compress_statistics=True,
                quant_type="nf4",
                quant_storage=torch.uint8,
            )
            for e in range(self.num)
        ]

    def expert(self, e: int) -> torch.Tensor:
        """Expert `e`'s slice (a, b), dequantized to the dtype it was quantized from."""
        from bitsandbytes.functional import dequantize_4bit

        packed, state = self.experts[e]
        return dequantize_4bit(packed, state).view(self.shape)

    def to(self, device: torch.device) -> NF4Stack:
        """The 4-bit values and their scales moved to `device` (bitsandbytes' QuantState moves in place)."""
        moved = []
        for packed, state in self.experts:
            state.to(device)
            moved.append((packed.to(device), state))
        self.experts = moved
        return self

    def nbytes(self) -> int:
        """The bytes its 4-bit values and block scales hold (not bitsandbytes' 16-entry code tables, shared by kind)."""
        total = 0
        for packed, state in self.experts:
            total += packed.nbytes + state.absmax.nbytes
            if state.nested:
                total += state.state2.absmax.nbytes + state.offset.nbytes
        return total


class Dequantized:
    """An NF4Stack as `Segments` reads a stack (E, in, out): expert e's slice dequantized when indexed, in `dtype`,
    transposed where the family stores (E, out, in) (`flip`); `transpose(1, 2)` is backward's (E, out, in)."""

    requires_grad = False

    def __init__(self, stack: NF4Stack, dtype: torch.dtype, flip: bool):
        self.stack, self.dtype, self.flip = stack, dtype, flip
        a, b = stack.shape
        self.shape = (stack.num, b, a) if flip else (stack.num, a, b)

    def __getitem__(self, e: int) -> torch.Tensor:
        w = self.stack.expert(e).to(self.dtype)
        return w.t() if self.flip else w

    def transpose(self, *_dims) -> Dequantized:
        return Dequantized(self.stack, self.dtype, not self.flip)


def quantize_experts(model: torch.nn.Module) -> int:
    """Every stacked expert projection of `model` in NF4 (NF4Stack, kept as the module's `tunelab_nf4`), the 16-bit
    stack freed: its parameter becomes a NaN of the stack's shape broadcast without storage, so that PEFT still
    reads the shape, dtype and device it adapts (target_parameters), parameter counts count its values, and any
    path that read it instead of the 4-bit copy would give NaN, not a silently wrong model. Returns the stacks."""
    done = 0
    for _, module in experts_modules(model):
        for name in EXPERT_PARAMS:
            weight = getattr(module, name, None)
            if not isinstance(weight, torch.nn.Parameter) or weight.dim() != 3:
                continue
            if not hasattr(module, "tunelab_nf4"):
                module.tunelab_nf4 = {}
            module.tunelab_nf4[name] = NF4Stack(weight.detach())
            setattr(module, name, _placeholder(weight.shape, weight.dtype, weight.device))
            done += 1
    return done


def _placeholder(shape, dtype: torch.dtype, device: torch.device) -> torch.nn.Parameter:
    """A 4-bit stack's stand-in parameter: one NaN broadcast to the stack's shape (quantize_experts)."""
    empty = torch.full((), float("nan"), dtype=dtype, device=device).expand(shape)
    return torch.nn.Parameter(empty, requires_grad=False)


def move_quantized(model: torch.nn.Module, device: torch.device) -> None:
    """`model`, quantized in host memory (bitsandbytes' 4-bit linears, quantize_experts' stacks), moved to
    `device` whole. The stacks' stand-ins are set aside first: moving a broadcast tensor allocates its full size."""
    held = []
    for module in model.modules():
        for name, stack in getattr(module, "tunelab_nf4", {}).items():
            weight = getattr(module, name)
            held.append((module, name, weight.shape, weight.dtype))
            setattr(module, name, torch.nn.Parameter(weight.new_empty(0), requires_grad=False))
            stack.to(device)
    model.to(device)
    for module, name, shape, dtype in held:
        setattr(module, name, _placeholder(shape, dtype, device))
    if getattr(model, "hf_device_map", None) is not None:  # where from_pretrained put it, as loading there would say
        model.hf_device_map = {"": device}


def quantized_stacks(model: torch.nn.Module) -> list[NF4Stack]:
    """The 4-bit expert stacks of `model` (quantize_experts)."""
    return [s for m in model.modules() for s in getattr(m, "tunelab_nf4", {}).values()]


# --- LoRA on the stacked experts -------------------------------------------------------------------------------


def lora_factors(wrapper) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """PEFT ParamWrapper's active adapter as (A (E, in, r), B (E, r, out), scaling), in PEFT's layout: lora_A's
    weight is (E·r, in) expert-major, lora_B's (out, r·E) expert-minor (ParamWrapper.get_delta_weight). None when
    the adapter is disabled or merged."""
    if wrapper.disable_adapters or wrapper.merged:
        return None
    adapters = [a for a in wrapper.active_adapters if a in wrapper.lora_A]
    if not adapters:
        return None
    name = adapters[0]
    e = wrapper.num_experts
    a = wrapper.lora_A[name].weight  # (E·r, in)
    b = wrapper.lora_B[name].weight  # (out, r·E)
    a = a.view(e, -1, a.shape[-1]).transpose(1, 2)  # (E, in, r)
    b = b.view(b.shape[0], -1, e).permute(2, 1, 0).contiguous()  # (E, r, out)
    return a, b, wrapper.scaling[name]


def _passthrough(self, *args, **kwargs):
    return self.base_layer(*args, **kwargs)


def fuse_lora(model: torch.nn.Module) -> int:
    """Point each stacked experts module at the PEFT ParamWrappers around it, and make the wrappers' forward a
    plain call of what they wrap: the grouped forward reads the factors itself. Returns the wrappers fused."""
    from peft.tuners.lora.layer import ParamWrapper

    fused = 0
    for module in model.modules():
        if not isinstance(module, ParamWrapper):
            continue
        base = module.get_base_layer()
        if not hasattr(base, "tunelab_lora"):
            base.tunelab_lora = {}
        base.tunelab_lora[module.parameter_name] = module
        module.forward = types.MethodType(_passthrough, module)
        fused += 1
    return fused


# --- the router's load-balancing loss --------------------------------------------------------------------------


class RouterLoss:
    """The family's own load-balancing loss (transformers' load_balancing_loss_func of its modeling module) and its
    weight in the training loss: router_aux_loss_coef when output_router_logits is set, as transformers adds it;
    otherwise 0 (measured and reported, not trained)."""

    def __init__(self, model: torch.nn.Module):
        config = model.config
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.function = importlib.import_module(type(base).__module__).load_balancing_loss_func
        self.experts = families.experts(config)[1]
        self.top_k = int(config.num_experts_per_tok)
        self.coef = float(getattr(config, "router_aux_loss_coef", 0.0) or 0.0)
        self.trains = bool(getattr(config, "output_router_logits", False)) and self.coef > 0

    def __call__(self, router_logits: tuple[torch.Tensor, ...], mask: torch.Tensor | None) -> torch.Tensor:
        """The loss over the tokens `mask` marks (flat B·T; None: every token)."""
        return self.function(tuple(router_logits), self.experts, self.top_k, mask)


def expert_load(router_logits: tuple[torch.Tensor, ...], top_k: int, experts: int) -> torch.Tensor:
    """Each expert's share of the routed (token, expert) pairs, summed over layers: (E,), sums to 1."""
    counts = torch.zeros(experts, dtype=torch.float64)
    for logits in router_logits:
        picked = torch.topk(logits.detach().float(), top_k, dim=-1).indices.reshape(-1).cpu()
        counts += torch.bincount(picked, minlength=experts).double()
    return counts / counts.sum().clamp(min=1)
