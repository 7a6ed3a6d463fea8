"""Activation offloading: the tensors autograd saves for backward live in (pinned) host memory, not the device's.

With gradient checkpointing (`grad_ckpt: true`) each decoder layer keeps only its input, the residual stream,
and recomputes the rest in backward (as Unsloth's offloaded checkpointing does): the inputs go to host memory
as the forward passes each layer, and in backward the input of the layer before is fetched while this one is
recomputed, so the device holds the layers in flight, not one input per layer. Without checkpointing every
tensor a decoder layer saves goes to the host (torch.autograd.graph.save_on_cpu's scheme), per layer.

On CUDA the copies run on a side stream, overlapped with compute, into pinned buffers; on a CPU the saved
tensors already are in host memory, so training skips the hooks there (`apply`), while tests run the same hooks
with a copy (`Offloader(copy_on_cpu=True)`) to check that gradients do not change. Parameters (and views of
them) and tensors under `MIN_BYTES` stay where they are: copying a weight out and back saves nothing.
"""

from __future__ import annotations

import functools
import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.checkpoint import checkpoint

# Saved tensors smaller than this stay on the device: the copy's fixed cost outweighs the memory.
MIN_BYTES = 1 << 16


class _Held:
    """A saved tensor's host copy and the event its copy completes on (None when it stayed, or on CPU)."""

    __slots__ = ("tensor", "host", "event", "device", "fetched", "uses", "source", "__weakref__")

    def __init__(self, tensor=None, host=None, event=None, device=None):
        self.tensor, self.host, self.event, self.device, self.fetched = tensor, host, event, device, None
        self.uses = 1  # saves of this same tensor (q, k and v projections save one shared input)
        self.source = None  # a weak reference to the storage copied (StorageWeakRef: to the storage itself, not to a
        # Python wrapper of it): while it lives, a save of it shares the copy


def view_key(t: torch.Tensor) -> tuple:
    return (t.storage_offset(), t.shape, t.stride(), t.dtype)


class Offloader:
    """saved_tensors_hooks that move saved tensors to host memory and back, grouped per decoder layer so that
    backward can prefetch the layer before while this one runs."""

    def __init__(self, copy_on_cpu: bool = False):
        self.copy_on_cpu = copy_on_cpu
        # Weak values: autograd holds what pack returned for as long as backward may read it. A tensor saved by a
        # graph that the forward then drops is never unpacked; its copy goes with that graph instead of staying
        # here (and in pinned host memory) for good.
        self.groups: dict[int, weakref.WeakValueDictionary] = {}
        self.next_group = 0
        self._stream = None

    def stream(self, device: torch.device):
        if device.type != "cuda":
            return None
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        return self._stream

    def new_group(self) -> int:
        group, self.next_group = self.next_group, self.next_group + 1
        self.groups[group] = weakref.WeakValueDictionary()
        return group

    def host_bytes(self) -> int:
        """Bytes of saved tensors now held on the host (what left the device)."""
        held = (h for g in list(self.groups.values()) for h in g.values())
        return sum(h.host.numel() * h.host.element_size() for h in held if h.host is not None)

    def pack(self, t: torch.Tensor, group: int) -> tuple[_Held, tuple | None]:
        """(the copy, how to view the saved tensor in it): a tensor that is most of its storage is copied as
        that whole storage, once per layer, so the views a layer saves of one buffer (q, k, v of a fused
        projection, a transpose) share one copy; a small slice is copied alone."""
        kept = isinstance(t, torch.nn.Parameter) or isinstance(getattr(t, "_base", None), torch.nn.Parameter)
        small = t.numel() * t.element_size() < MIN_BYTES
        if kept or small or (t.device.type == "cpu" and not self.copy_on_cpu) or t.layout != torch.strided:
            return _Held(tensor=t), None
        storage = t.untyped_storage()
        whole = 2 * t.numel() * t.element_size() >= storage.nbytes()
        view = (t.dtype, t.storage_offset(), t.shape, t.stride()) if whole else None
        key = (storage.data_ptr(), t._version) if whole else (storage.data_ptr(), t._version, *view_key(t))
        same = self.groups[group].get(key)
        if same is not None and not same.source.expired():  # the same buffer, saved again in this layer
            same.uses += 1
            return same, view
        source = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage) if whole else t.detach()
        side = self.stream(t.device)
        if side is None:
            held = _Held(host=source.to("cpu", copy=True), device=t.device)
        else:
            side.wait_stream(torch.cuda.current_stream(t.device))
            with torch.cuda.stream(side):
                host = torch.empty(source.shape, dtype=source.dtype, pin_memory=True)
                host.copy_(source, non_blocking=True)
                event = torch.cuda.Event()
                event.record(side)
            t.record_stream(side)  # the allocator keeps t's memory until the copy has read it
            held = _Held(host=host, event=event, device=t.device)
        held.source = StorageWeakRef(storage)
        if same is not None:  # another buffer now at a freed one's address: both copies are kept
            key = (*key, len(self.groups[group]))
        self.groups[group][key] = held
        return held, view

    def prefetch(self, group: int) -> None:
        """Start copying a layer's saved tensors back to the device (backward, before that layer runs)."""
        for held in self.groups.get(group, {}).values():
            self._fetch(held)

    def _fetch(self, held: _Held) -> None:
        if held.fetched is not None or held.host is None:
            return
        side = self.stream(held.device)
        if side is None:
            held.fetched = held.host.to(held.device, copy=True)
            return
        with torch.cuda.stream(side):
            side.wait_event(held.event)
            held.fetched = held.host.to(held.device, non_blocking=True)
            held.event = torch.cuda.Event()
            held.event.record(side)

    def unpack(self, packed: tuple[_Held, tuple | None], group: int) -> torch.Tensor:
        held, view = packed
        if held.host is None:
            self._release(group)
            return held.tensor
        self._fetch(held)
        self.prefetch(group - 1)
        out = held.fetched
        if view is not None:
            dtype, offset, shape, stride = view
            out = torch.empty(0, dtype=dtype, device=out.device).set_(out.untyped_storage(), offset, shape, stride)
        if held.device.type == "cuda":
            torch.cuda.current_stream(held.device).wait_event(held.event)
            out.record_stream(torch.cuda.current_stream(held.device))
        held.uses -= 1
        if held.uses:  # another save of the same tensor still reads the fetched copy
            return out
        held.fetched, held.host = None, None  # each save is unpacked once (no retain_graph)
        self._release(group)
        return out

    def _release(self, group: int) -> None:
        """Forget a layer's group once none of its copies is left to unpack."""
        if group in self.groups and not any(h.host is not None for h in self.groups[group].values()):
            del self.groups[group]

    def hooks(self):
        """The saved_tensors_hooks context of one new group (a decoder layer's forward)."""
        group = self.new_group()
        return torch.autograd.graph.saved_tensors_hooks(
            functools.partial(self.pack, group=group), functools.partial(self.unpack, group=group)
        )


class _OffloadedCheckpoint(torch.autograd.Function):
    """A decoder layer's forward without autograd, its input kept on the host; backward fetches the input and
    recomputes the layer under the forward's autocast and RNG state, then backpropagates through it."""

    @staticmethod
    def forward(ctx, offloader: Offloader, run, hidden: torch.Tensor, *args):
        ctx.offloader, ctx.run, ctx.args = offloader, run, args
        ctx.group = offloader.new_group()
        ctx.packed = offloader.pack(hidden, ctx.group)
        ctx.autocast = _autocast_state(hidden.device)
        ctx.rng = _rng_state(hidden.device)
        with torch.no_grad():
            return run(hidden, *args)

    @staticmethod
    def backward(ctx, grad_out):
        hidden = ctx.offloader.unpack(ctx.packed, ctx.group).detach().requires_grad_(True)
        device = hidden.device
        with _restored_rng(device, ctx.rng), torch.enable_grad(), _autocast(device, ctx.autocast):
            out = ctx.run(hidden, *ctx.args)
        torch.autograd.backward(out, grad_out)
        return (None, None, hidden.grad) + (None,) * len(ctx.args)


def _autocast_state(device: torch.device):
    kind = device.type
    return (torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))


def _autocast(device: torch.device, state):
    enabled, dtype = state
    return torch.autocast(device.type, dtype=dtype, enabled=enabled)


def _rng_state(device: torch.device):
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


class _restored_rng:
    """Forks the RNG, sets the forward's state, and restores the present one after (torch.utils.checkpoint's
    preserve_rng_state): LoRA dropout draws the same masks in the recompute."""

    def __init__(self, device, state):
        self.device, self.state = device, state

    def __enter__(self):
        self.saved = _rng_state(self.device)
        torch.set_rng_state(self.state[0])
        if self.state[1] is not None:
            torch.cuda.set_rng_state(self.state[1], self.device)

    def __exit__(self, *exc):
        torch.set_rng_state(self.saved[0])
        if self.saved[1] is not None:
            torch.cuda.set_rng_state(self.saved[1], self.device)


def _drop_cache(kwargs: dict) -> None:
    """The recompute would write a KV cache a second time (transformers' own checkpointing drops it too)."""
    kwargs.update({k: None for k in ("cache", "past_key_values", "layer_past") if k in kwargs})
    if "use_cache" in kwargs:
        kwargs["use_cache"] = False


def _checkpointed_class(cls: type) -> type:
    """A subclass of decoder-layer class `cls` whose call is checkpointed (non-reentrant, RNG state kept for LoRA
    dropout's recompute) around the whole call: outside torch.compile's region when the blocks are compiled, so
    the compiled forward and backward graphs run inside the checkpoint and never trace it. transformers' own
    checkpointing moved inside `forward` in 5.25, where dynamo traces the checkpoint as a higher-order op and
    breaks the block's graph on its side effects; this wrapper does not depend on where transformers puts it."""

    def __call__(self, hidden, *args, **kwargs):
        if not (self.training and torch.is_grad_enabled()):
            return torch.nn.Module.__call__(self, hidden, *args, **kwargs)
        _drop_cache(kwargs)
        run = functools.partial(torch.nn.Module.__call__, self, **kwargs)
        return checkpoint(run, hidden, *args, use_reentrant=False)

    return type(f"Checkpointed{cls.__name__}", (cls,), {"__call__": __call__})


def _offloaded_class(cls: type, offloader: Offloader, grad_ckpt: bool) -> type:
    """A subclass of decoder-layer class `cls` whose call offloads: outside the layer's own forward (and so
    outside torch.compile's region when the blocks are compiled: compiled forward and backward graphs run
    inside, and only the copies are added around them)."""

    def __call__(self, hidden, *args, **kwargs):
        if not (self.training and torch.is_grad_enabled()):
            return torch.nn.Module.__call__(self, hidden, *args, **kwargs)
        if grad_ckpt:
            _drop_cache(kwargs)
            run = functools.partial(torch.nn.Module.__call__, self, **kwargs)
            return _OffloadedCheckpoint.apply(offloader, run, hidden, *args)
        with offloader.hooks():
            return torch.nn.Module.__call__(self, hidden, *args, **kwargs)

    return type(f"Offloaded{cls.__name__}", (cls,), {"__call__": __call__})


def _swap_layer_classes(model: torch.nn.Module, make) -> None:
    """Give every decoder layer the subclass `make(type(layer))`. One subclass per decoder-layer class, shared by
    all its layers: a class per layer made torch.compile guard on each layer's type and recompile per layer, past
    its limit of 8 (H200, 2026-11-26: the 8B row fell back to eager blocks at 65,536 tokens and ran out of
    memory)."""
    classes: dict[type, type] = {}
    for layer in model.get_decoder().layers:
        base = type(layer)
        if base not in classes:
            classes[base] = make(base)
        layer.__class__ = classes[base]


def apply(model: torch.nn.Module, enabled: bool, grad_ckpt: bool, copy_on_cpu: bool = False) -> Offloader | None:
    """Checkpoint `model`'s decoder layers (`grad_ckpt`) and offload their saved activations (`enabled`; see the
    module docstring). On a CPU model (whose tensors already are in host memory) it only checkpoints, unless
    `copy_on_cpu`. Returns the offloader (None when nothing is offloaded)."""
    device = next(model.parameters()).device
    if not enabled or (device.type == "cpu" and not copy_on_cpu):
        if grad_ckpt:
            _swap_layer_classes(model, _checkpointed_class)
        return None
    offloader = Offloader(copy_on_cpu)
    if grad_ckpt:
        # The first layer's input (the embedding's output, frozen under LoRA) must require grad, or the
        # checkpoint's output would not, and no adapter below it would get a gradient.
        model.enable_input_require_grads()
    _swap_layer_classes(model, lambda base: _offloaded_class(base, offloader, grad_ckpt))
    return offloader
