"""Data-parallel runs: the processes that `accelerate launch` (torchrun underneath) started, as Accelerate sees them.

Accelerate and torch.distributed do the work (process group, DDP/DeepSpeed wrapping, FSDP2's fully_shard,
all-reduce); this module joins the launcher's process group with a timeout, says which process this is (so the
recipe can shard batches by rank and let the main process alone write to output_dir), and applies FSDP2 when
the launch config asks for it: tunelab calls fully_shard itself because Accelerate 1.15 applies FSDP only to
accelerator processes (CPU processes stay MULTI_CPU, i.e. DDP), and one call serves CPU and GPU runs alike.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

from ..errors import Terminated, TunelabError

# A collective that waits longer than this fails the run instead of hanging it. Long enough for the main
# process to write a checkpoint or best/ while the others wait at the next collective.
PROCESS_GROUP_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True)
class Processes:
    rank: int
    world: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0


def join(device: torch.device) -> Processes:
    """This process's rank, the world size and its device; joins the launcher's process group (gloo on CPU,
    NCCL on GPUs) the first time. A process that no launcher started is rank 0 of 1 on `device`."""
    from accelerate import PartialState
    from accelerate.utils import InitProcessGroupKwargs

    kwargs = InitProcessGroupKwargs(timeout=PROCESS_GROUP_TIMEOUT).to_kwargs()
    state = PartialState(cpu=device.type == "cpu", **kwargs)
    if state.num_processes == 1:
        return Processes(0, 1, device)
    end_on_sigterm()
    # Under a launcher each rank owns one accelerator (cuda:LOCAL_RANK), whatever `device` named.
    return Processes(state.process_index, state.num_processes, device if device.type == "cpu" else state.device)


def end_on_sigterm() -> None:
    """In a launched process, SIGTERM raises errors.Terminated where the process is, instead of ending it on the
    spot: torchrun sends it to every other process when one fails, and a main process ended on the spot keeps
    the output directory it had just created (and its lock) instead of removing them on the way out."""
    import signal

    def terminated(signum, frame):
        raise Terminated(f"ended by signal {signum}")

    signal.signal(signal.SIGTERM, terminated)


def fsdp_plugin():
    """The launch config's FSDP settings, as Accelerate reads them from the environment `accelerate launch` sets;
    None when the launch asks for no FSDP."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return None
    return FullyShardedDataParallelPlugin()


def plugin_settings(plugin) -> dict:
    """An FSDP plugin's settings under their Accelerate config names, for launch.check_fsdp."""
    return {"fsdp_version": plugin.fsdp_version, "fsdp_activation_checkpointing": plugin.activation_checkpointing}


def loads_once(plugin) -> bool:
    """Whether the main process alone reads the weights (the config's fsdp_cpu_ram_efficient_loading): the others
    build the model on the meta device and receive their shards from it (broadcast_weights)."""
    return plugin is not None and bool(plugin.cpu_ram_efficient_loading)


def broadcast_weights(root: torch.nn.Module, weights: dict[str, torch.Tensor], device: torch.device) -> None:
    """Fill the shards of `root`, sharded by `shard`, from `weights`: the main process's full state dict, taken
    before sharding (empty on the other processes, whose modules are on the meta device). Each process allocates
    its shards (to_empty), torch's set_model_state_dict sends one tensor at a time from the main process and
    keeps each process's part, and the buffers, which FSDP does not shard and no state dict holds when they are
    non-persistent (RoPE's inverse frequencies), are sent whole."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if not weights:  # the main process's shards hold its weights already; the others allocate theirs
        root.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(root, weights, options=options)
    for buffer in root.buffers():
        dist.broadcast(buffer, src=0)


def shard(root: torch.nn.Module, plugin, compute: torch.dtype, device: torch.device, world: int) -> None:
    """Shard `root` (train/loss.CausalLMLoss) over the `world` processes with torch's FSDP2 `fully_shard`, on CPU
    (gloo) as on GPUs: each block the config names (fsdp_transformer_layer_cls_to_wrap) is one unit, gathered
    for its forward and backward; the root holds the rest (embeddings, final norm, LM head), gathered for the
    whole root forward, in which the fused loss reads the head's weight outside the head's own forward.

    Below fp32 the shards stay in their dtype (fp32 for trainable weights) and FSDP casts each gathered weight to
    the compute dtype and reduces gradients in fp32; no autocast runs (Accelerate applies none to FSDP2 models).
    """
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    try:
        policy = fsdp2_prepare_auto_wrap_policy(plugin, root)
    except ValueError as e:
        raise TunelabError(f"the Accelerate config's fsdp_transformer_layer_cls_to_wrap: {e}") from None
    mp = MixedPrecisionPolicy()
    if compute != torch.float32:
        mp = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    kwargs = {"mesh": init_device_mesh(device.type, (world,)), "mp_policy": mp, "offload_policy": plugin.cpu_offload}
    for block in [m for m in root.modules() if policy is not None and policy(m)]:
        fully_shard(block, reshard_after_forward=plugin.reshard_after_forward, **kwargs)
    fully_shard(root, **kwargs)  # the root keeps its weights gathered from forward to backward


@contextmanager
def unsharded_root(root: torch.nn.Module) -> Iterator[None]:
    """The FSDP-sharded `root`'s own weights (embeddings, final norm, LM head: what no block holds) gathered while
    code calls the modules below it directly, as sampling and scoring do, without the root's forward (whose hook
    would gather them); each block gathers its own around its forward. The root's state is initialised as its
    first forward would (FSDP2 takes the first module to run forward as its root), then its weights resharded
    after. Every process must enter it alike."""
    state = root._get_fsdp_state()
    state._lazy_init()  # torch 2.13's FSDPState: a no-op once the root has run forward
    root.unshard()
    try:
        yield
    finally:
        root.reshard()


def local_numel(module: torch.nn.Module) -> int:
    """Parameter elements this process holds: all of them, or its shards' under FSDP."""
    from torch.distributed.tensor import DTensor

    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in module.parameters())


def full_state_dict(root: torch.nn.Module, trainable_only: bool) -> dict | None:
    """The unsharded weights of the FSDP-sharded `root` on the main process (None elsewhere), named as
    `root.model.state_dict()` names them; every process must call it, as it gathers the shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.tensor import DTensor

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
    state = get_model_state_dict(root, options=options)
    if not is_main():
        return None
    # On one CUDA process the state came back as DTensors over a one-device mesh, which have no storage of their
    # own: safetensors failed on them ("invalid python storage", H200, torch 2.11). Plain CPU tensors always.
    plain = {k: (v.full_tensor() if isinstance(v, DTensor) else v).cpu() for k, v in state.items()}
    return {k.removeprefix("model."): v for k, v in plain.items()}


def gather_checkpoint(root: torch.nn.Module, optimizer) -> tuple[dict, dict] | None:
    """The FSDP-sharded `root`'s trainable weights and its optimizer's state, unsharded on the main process (None
    elsewhere), in the form one process's checkpoint.save writes: weights named as `root.model` names its
    parameters, and torch.optim's own state dict, keyed by each parameter's index in the optimizer's groups.
    So a checkpoint is the same file whatever the number of processes, and resumes under any. Every process must
    call it, as it gathers the shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    trainable = [n.removeprefix("model.") for n, p in root.named_parameters() if p.requires_grad]
    weights = full_state_dict(root, trainable_only=True)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    by_name = get_optimizer_state_dict(root, _plain(optimizer), options=options)
    if not is_main():
        return None
    return {n: weights[n] for n in trainable}, _by_index(by_name)


def load_checkpoint(path: Path, root: torch.nn.Module, optimizer, scheduler):
    """checkpoint.load for an FSDP-sharded `root`: the main process reads the weights and optimizer state and
    broadcasts them, each process keeping its shards. Every process checks the file against the model first
    (headers only) and so fails alike, none waiting alone in a broadcast.

    RNG states: a checkpoint holds the main process's, as under DDP, and every process restores them; processes
    are seeded alike (Accelerate's set_seed) and draw alike (the same shapes each step)."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    from . import checkpoint

    checkpoint.check_weights(path, root.model)
    main = is_main()
    resume = checkpoint.read_resume(path, optimizer=main)
    weights = {f"model.{k}": v for k, v in load_file(path / checkpoint.WEIGHTS).items()} if main else {}
    # Not strict: the checkpoint holds the trainable weights only (LoRA's frozen base is not in it).
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    set_model_state_dict(root, weights, options=options)
    optim = _plain(optimizer)
    by_name = _by_name(resume["optimizer"], root, optim) if main else {}
    set_optimizer_state_dict(
        root, optim, by_name, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    scheduler.load_state_dict(resume["scheduler"])
    checkpoint.set_rng_state(resume["rng"])
    return checkpoint.read_state(path)


def _plain(optimizer) -> torch.optim.Optimizer:
    """The torch optimizer inside Accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


def _by_index(state: dict) -> dict:
    """An optimizer state dict keyed by parameter names (torch.distributed.checkpoint's) keyed as torch.optim keys
    it: by position over the parameter groups, in order."""
    index: dict[str, int] = {}
    groups = [{**g, "params": [index.setdefault(n, len(index)) for n in g["params"]]} for g in state["param_groups"]]
    return {"state": {index[n]: s for n, s in state["state"].items()}, "param_groups": groups}


def _by_name(state: dict, root: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The inverse of _by_index for `optimizer`, whose parameters `root` names."""
    names = {id(p): n for n, p in root.named_parameters()}
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    saved = sum(len(g["params"]) for g in state["param_groups"])
    if saved != len(order):
        raise TunelabError(
            f"resume: the checkpoint's optimizer state covers {saved} parameters, this run trains {len(order)}; "
            "resume with the config it was made with"
        )
    groups = [{**g, "params": [order[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {order[i]: s for i, s in state["state"].items()}, "param_groups": groups}


def exit_launched(status: int = 0) -> int:
    """At the end of a run, successful or failed with tunelab's one-line error: in a launched process of a
    data-parallel run (world > 1), leave the process group and exit with `status` without Python's interpreter
    teardown; elsewhere return `status`. Under gloo, a process that reaches interpreter teardown with the
    process group alive can abort there ("terminate called without an active exception", SIGABRT) after its
    run ended well: gloo's worker threads still hold work whose tensors drop Python references after the
    interpreter has gone (pytorch/pytorch#190489, #179291). No barrier first: the other processes must not wait
    on the main one's final save (a large model's can outlast the group's timeout), and leaving the group is
    each process's own business."""
    import sys

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return status
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def is_main() -> bool:
    """Whether this is the process that prints and writes (True outside a launched run)."""
    from accelerate import PartialState

    return not PartialState._shared_state or PartialState().is_main_process


def asks_for_deepspeed() -> bool:
    """Whether the launch config asks for DeepSpeed, as `accelerate launch` tells its processes (Accelerate
    itself ignores it on CPU processes)."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def prepare_deepspeed(
    deepspeed_config: dict, root: torch.nn.Module, micro_batch: int, stage: int, max_grad_norm: float = 1.0
) -> None:
    """What DeepSpeed needs before `accelerator.prepare`: the micro-batch (Accelerate reads it from a dataloader,
    which tunelab does not pass), and under ZeRO-3 the weights read outside their own module's forward, which
    ZeRO-3 would otherwise leave partitioned (empty) there: the LM head's weight, read by the fused loss in the
    root's forward, and each fused LoRA layer's base weight and bias and its A and B, which the layer reads
    without calling their modules (model/lora_linear.py). Registered, they are gathered for the reading module's
    forward and backward. (A and B below DeepSpeed's persistence threshold, 1e5 elements by default, are never
    partitioned; a large rank or width puts them above it.)"""
    deepspeed_config["train_micro_batch_size_per_gpu"] = micro_batch
    # DeepSpeed clips inside its step, with its own setting: tunelab's max_grad_norm decides (0: no clipping).
    deepspeed_config["gradient_clipping"] = max_grad_norm
    if stage != 3:
        return
    from deepspeed.zero import register_external_parameter

    from ..model.lora_linear import fused_layer_weights

    register_external_parameter(root, root.model.get_output_embeddings().weight)
    for module, weight in fused_layer_weights(root):
        register_external_parameter(module, weight)


def zero3_state_dict(root: torch.nn.Module, trainable_only: bool) -> dict | None:
    """full_state_dict for a ZeRO-3 run: every process takes part in gathering the partitioned weights; the
    main process gets them (on the CPU), named as `root.model.state_dict()` names them.

    One module's own weights are gathered at a time: gathering all at once would hold the whole unsharded
    model on every GPU beside its shards (16 GB more per GPU for an 8B in bf16), the memory ZeRO-3 is there
    to save."""
    import deepspeed

    model = root.model
    names: dict[int, list[str]] = {}  # every state-dict key of a tensor: tied weights have two
    buffers = {}
    state = model.state_dict(keep_vars=True)
    for key, value in state.items():
        names.setdefault(id(value), []).append(key)
        if not isinstance(value, torch.nn.Parameter):
            buffers[key] = value  # ZeRO-3 partitions parameters only
    main = is_main()
    out: dict[str, torch.Tensor] = {}
    for module in model.modules():
        params = [p for p in module.parameters(recurse=False) if p.requires_grad or not trainable_only]
        if not params:
            continue
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            if main:
                for p in params:
                    copy = p.detach().cpu().clone()
                    out.update((key, copy) for key in names.get(id(p), ()))
    if not main:
        return None
    if not trainable_only:
        out.update((key, value.detach().cpu().clone()) for key, value in buffers.items())
    return {key: out[key] for key in state if key in out}
