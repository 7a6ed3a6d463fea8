"""Data-parallel runs: the processes that `accelerate launch` (torchrun underneath) started, as Accelerate sees them.

Accelerate and torch.distributed do the work (process group, DDP/FSDP/DeepSpeed wrapping, all-reduce); this
module only joins the launcher's process group with a timeout and says which process this is, so the
recipe can shard batches by rank and let the main process alone write to output_dir.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

from ..errors import TunelabError

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
    # Under a launcher each rank owns one accelerator (cuda:LOCAL_RANK), whatever `device` named.
    return Processes(state.process_index, state.num_processes, device if device.type == "cpu" else state.device)


def check_backend(accelerator) -> None:
    """Refuse a launch whose Accelerate config asks for FSDP where Accelerate would silently fall back to DDP.

    Accelerate 1.15 turns FSDP on only for multi-accelerator runs (AcceleratorState keeps MULTI_CPU when the
    config says FSDP), so on CPU the model would be replicated, not sharded, with no word about it.
    """
    from accelerate.utils import DistributedType

    fsdp_asked = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if fsdp_asked and accelerator.distributed_type != DistributedType.FSDP:
        raise TunelabError(
            f"FSDP needs GPUs: Accelerate runs it only on CUDA/XPU/NPU devices, and this run is "
            f"{accelerator.distributed_type.value} on {accelerator.device.type}; use configs/accelerate/ddp.yaml here"
        )


def is_main() -> bool:
    """Whether this is the process that prints and writes (True outside a launched run)."""
    from accelerate import PartialState

    return not PartialState._shared_state or PartialState().is_main_process


def read_accelerate_config(path: str | Path) -> dict:
    """An Accelerate config file's settings, checked for what this machine can run before N processes start."""
    import importlib.util

    import yaml

    file = Path(path)
    if not file.is_file():
        raise TunelabError(f"--accelerate-config {file}: no such file; see configs/accelerate/")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as e:
        raise TunelabError(f"--accelerate-config {file}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict) or "distributed_type" not in data:
        raise TunelabError(f"--accelerate-config {file}: no distributed_type key; is this an Accelerate config?")
    if data["distributed_type"] == "FSDP" and not torch.accelerator.is_available():
        # Accelerate 1.15 would start the processes and silently replicate the model (see check_backend).
        raise TunelabError(
            f"--accelerate-config {file}: FSDP runs on GPUs only (Accelerate 1.15 keeps CPU processes on DDP); "
            "use configs/accelerate/ddp.yaml"
        )
    if data["distributed_type"] == "DEEPSPEED" and importlib.util.find_spec("deepspeed") is None:
        raise TunelabError(
            f"--accelerate-config {file}: needs DeepSpeed, which is not installed (pip install deepspeed)"
        )
    return data


def launch_command(nproc: int | None, config_file: str | None, argv: list[str]) -> list[str]:
    """The `accelerate launch` command line that runs `tunelab <argv>` on `nproc` processes.

    Without a config file the launch is plain DDP (`--multi_gpu`, which Accelerate also uses for gloo
    processes on CPU: each process then finds no GPU and joins with the gloo backend) on a free port.
    """
    import sys

    if nproc is not None and nproc < 1:
        raise TunelabError(f"--nproc {nproc}: needs at least 1 process")
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    if config_file is not None:
        read_accelerate_config(config_file)
        cmd += ["--config_file", str(config_file)]
        if nproc is not None:
            cmd += ["--num_processes", str(nproc)]
    else:
        n = nproc or 1
        cmd += ["--num_processes", str(n), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
        cmd += ["--multi_gpu", "--main_process_port", "0"] if n > 1 else []
    return [*cmd, "-m", "tunelab.cli", *argv]
