"""How one training job runs across processes: one `Strategy` per way (one process or DDP, FSDP2, DeepSpeed
ZeRO), each owning how the model loads and is wrapped, how its full weights are gathered for a save, and how a
checkpoint is loaded and gathered. The recipe (recipes/finetune.py) asks `pick_strategy` once and never branches on
the way itself."""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import OptimizerConfig, TrainConfig
from ..errors import TunelabError
from ..model.adapters import count_parameters
from ..train import checkpoint, distributed, launch, loop, optim
from ..train.checkpoint import TrainState
from ..train.pair_loss import loss_module


@dataclass(kw_only=True)
class Trainee:
    """The model as the run trains it."""

    model: torch.nn.Module  # the adapted model: evaluated, saved
    root: torch.nn.Module  # CausalLMLoss around it, as built (before Accelerate wrapped it)
    loss_fn: torch.nn.Module  # what the loop calls: `root` as Accelerate or DeepSpeed prepared it
    optimizer: object
    scheduler: object
    params_trainable: int
    params_total: int


@dataclass
class Strategy:
    """One process, or DDP (Accelerate wraps the model; every rank holds all of it)."""

    procs: distributed.Processes

    @property
    def sharded(self) -> bool:
        """Each process holds a shard of the weights, gathered around every forward: the processes must run the
        same forwards (a generating source's sampling and scoring included)."""
        return False

    def loading(self) -> AbstractContextManager:
        """Around building the model."""
        return nullcontext()

    def load_device(self) -> torch.device | None:
        """Where the model loads (None: the run's device)."""
        return None

    def meta(self) -> bool:
        """Build empty (meta) modules: this process gets its weights from another."""
        return False

    def shard(self, root: torch.nn.Module, compute: torch.dtype, device: torch.device) -> None:
        """Split `root` over the processes, before the optimizer, which must hold what each process keeps."""

    def prepare(self, accelerator, root: torch.nn.Module, optimizer, cfg: TrainConfig):
        """(the module the loop calls, the optimizer it steps)."""
        return accelerator.prepare(root, optimizer)

    def gather(self, trainee: Trainee, trainable_only: bool) -> Callable[[], dict | None] | None:
        """Collects the full weights for a final or best save, which every process must call; None: the model
        holds them already."""
        return None

    def load_checkpoint(self, path: Path, trainee: Trainee) -> TrainState:
        """Every rank loads the same checkpoint."""
        return checkpoint.load(path, trainee.model, trainee.optimizer, trainee.scheduler)

    def checkpoint_gatherer(self, trainee: Trainee) -> Callable[[], tuple[dict, dict] | None] | None:
        """Gathers the weights and optimizer state a checkpoint writes (loop.LoopContext.gather_checkpoint)."""
        return None

    def setup(
        self, accelerator, build: Callable[..., torch.nn.Module], optim_spec: OptimizerConfig, cfg, prep
    ) -> Trainee:
        """Build the model (`build(device, meta)`), shard it, and hand it with its optimizer to Accelerate."""
        with self.loading():
            model = build(self.load_device(), self.meta())
        trainable, total = count_parameters(model)
        root = loss_module(model, cfg.objective, cfg.adapter.row.trains_base)
        self.shard(root, prep.precision.compute, prep.device)
        optimizer = optim.build_optimizer(root, optim_spec, prep.device)
        scheduler = loop.build_scheduler(optimizer, optim_spec, prep.schedule.total_steps)
        loss_fn, optimizer = self.prepare(accelerator, root, optimizer, cfg)
        return Trainee(
            model=model,
            root=root,
            loss_fn=loss_fn,
            optimizer=optimizer,
            scheduler=scheduler,
            params_trainable=trainable,
            params_total=total,
        )


@dataclass
class Fsdp2(Strategy):
    """FSDP2 (`accelerate launch` with fsdp_version 2): the model loads into CPU memory and sharding moves each
    process's shards to its device, so that the whole model never has to fit one GPU; with
    fsdp_cpu_ram_efficient_loading only the main process reads the weights and the others build meta modules."""

    plugin: object = None

    @property
    def sharded(self) -> bool:
        return True

    @property
    def once(self) -> bool:
        return distributed.loads_once(self.plugin)

    def load_device(self) -> torch.device | None:
        return torch.device("cpu")

    def meta(self) -> bool:
        return self.once and not self.procs.main

    def shard(self, root: torch.nn.Module, compute: torch.dtype, device: torch.device) -> None:
        weights = root.state_dict() if self.once and self.procs.main else {}
        distributed.shard(root, self.plugin, compute, device, self.procs.world)
        if self.once:
            distributed.broadcast_weights(root, weights, device)

    def prepare(self, accelerator, root: torch.nn.Module, optimizer, cfg: TrainConfig):
        from accelerate.utils import DistributedType

        if accelerator.distributed_type != DistributedType.FSDP:
            # CPU processes: Accelerate would wrap the sharded model in DDP, so it gets only the optimizer; FSDP
            # syncs the gradients itself.
            return root, accelerator.prepare_optimizer(optimizer)
        # On GPUs Accelerate takes an already sharded model as it is (accelerate.utils.fsdp2_prepare_model)
        # and registers it, which its gradient clipping under fp16 loss scaling needs.
        return accelerator.prepare(root, optimizer)

    def gather(self, trainee: Trainee, trainable_only: bool):
        return functools.partial(distributed.full_state_dict, trainee.loss_fn, trainable_only)

    def load_checkpoint(self, path: Path, trainee: Trainee) -> TrainState:
        return distributed.load_checkpoint(path, trainee.loss_fn, trainee.optimizer, trainee.scheduler)

    def checkpoint_gatherer(self, trainee: Trainee):
        return functools.partial(distributed.gather_checkpoint, trainee.loss_fn, trainee.optimizer)


@dataclass
class Zero(Strategy):
    """DeepSpeed ZeRO (GPUs only), at the stage DeepSpeed runs, a deepspeed_config_file's included."""

    plugin: object = None

    def loading(self) -> AbstractContextManager:
        # Accelerate hands transformers a ZeRO-3 config whatever zero3_init_flag says, and transformers would then
        # load every weight partitioned (empty here) under zero.Init; the engine partitions the whole model later.
        return self.plugin.zero3_init_context_manager(enable=False)

    def prepare(self, accelerator, root: torch.nn.Module, optimizer, cfg: TrainConfig):
        distributed.prepare_deepspeed(
            self.plugin.deepspeed_config,
            root,
            cfg.batch.micro_batch,
            self.plugin.zero_stage,
            cfg.optimizer.max_grad_norm,
        )
        return accelerator.prepare(root, optimizer)

    def gather(self, trainee: Trainee, trainable_only: bool):
        if self.plugin.zero_stage != 3:
            return None
        # The final and best saves gather ZeRO-3's partitioned weights.
        return functools.partial(distributed.zero3_state_dict, trainee.root, trainable_only)


def pick_strategy(accelerator, procs: distributed.Processes, cfg: TrainConfig) -> Strategy:
    """The way this launch runs, its settings checked against the config (one line naming the key otherwise)."""
    from accelerate.utils import DistributedType

    fsdp = distributed.fsdp_plugin() if procs.world > 1 else None
    if fsdp is not None:
        launch.check_fsdp(distributed.plugin_settings(fsdp), "the Accelerate config")
        launch.check_fsdp_run(cfg, "config")
        return Fsdp2(procs, fsdp)
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        launch.check_deepspeed_run(cfg, "config")
        return Zero(procs, accelerator.state.deepspeed_plugin)
    if distributed.asks_for_deepspeed():
        raise TunelabError(
            "the Accelerate config asks for DeepSpeed, which Accelerate runs on GPUs only; on CPU use "
            "configs/accelerate/fsdp2.yaml or ddp.yaml"
        )
    return Strategy(procs)
