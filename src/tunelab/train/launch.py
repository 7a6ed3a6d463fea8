"""Starting a data-parallel run: `tunelab train --nproc N` (or `--accelerate-config F`) checks the launch config
and the run's settings for what the processes could not honour, builds the `accelerate launch` command line and
relays the launcher's output, one line per failure. Nothing here imports torch: the launching process only
waits, while each launched process imports the training stack itself (train/distributed.py joins them).
"""

from __future__ import annotations

import re
from pathlib import Path

from .. import methods, objectives
from ..errors import TunelabError


def check_fsdp(settings: dict, source: str) -> None:
    """Refuse FSDP settings (an Accelerate config's fsdp_config keys) that tunelab's sharding (`shard`) would not
    honour, naming the key."""
    if settings.get("fsdp_version", 1) != 2:
        raise TunelabError(
            f"{source}: fsdp_version {settings.get('fsdp_version', 1)}: tunelab shards with FSDP2; set fsdp_version: 2"
        )
    if settings.get("fsdp_activation_checkpointing"):
        raise TunelabError(
            f"{source}: fsdp_activation_checkpointing: tunelab's grad_ckpt does that; set it false, grad_ckpt: true"
        )


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
    if data["distributed_type"] == "FSDP":
        check_fsdp(data.get("fsdp_config") or {}, f"--accelerate-config {file}")
    if data["distributed_type"] == "DEEPSPEED" and importlib.util.find_spec("deepspeed") is None:
        raise TunelabError(
            f"--accelerate-config {file}: needs DeepSpeed, which is not installed (pip install deepspeed)"
        )
    if data["distributed_type"] == "DEEPSPEED" and not has_cuda():
        # Accelerate runs CPU processes as plain DDP whatever the config says: refuse rather than pretend.
        raise TunelabError(
            f"--accelerate-config {file}: DeepSpeed runs on GPUs only (Accelerate starts CPU processes as DDP); "
            "on CPU use configs/accelerate/fsdp2.yaml, which shards there too, or ddp.yaml"
        )
    return data


def check_fsdp_run(cfg, source: str) -> None:
    """Refuse run settings that FSDP's sharding cannot honour."""
    row = cfg.objective.row
    if row.frozen_copy(cfg.adapter.row.trains_base, cfg.objective.grpo.beta if row.generates else 0.0):
        # The copy is held outside the module tree FSDP shards: whole on every process, where the model loaded.
        raise TunelabError(
            f"{source}: method {cfg.adapter.method} with objective {cfg.objective.name}'s reference model keeps a "
            "frozen copy of the weights, which FSDP does not shard; use configs/accelerate/ddp.yaml, or method lora "
            "(its reference is the adapter disabled)"
        )
    quant = methods.effective_base_quant(cfg.adapter.method, cfg.adapter.base_quant)
    if quant != "none":
        # fully_shard shards floating-point parameters only, not the integer storage of quantized ones.
        raise TunelabError(
            f"{source}: method {cfg.adapter.method} with base weights in {quant}: FSDP shards floating-point weights only; "
            "use configs/accelerate/ddp.yaml"
        )


def check_prompt_shares(cfg, nproc: int, source: str) -> None:
    """A generating objective (GRPO) samples each step's micro_batch x grad_accum prompts in shares, one per
    process, each prompt's group of completions within one process (recipes/grpo.shares): refuse more processes
    than prompts."""
    if not cfg.objective.row.generates:
        return
    prompts = cfg.batch.micro_batch * cfg.batch.grad_accum
    if nproc > prompts:
        raise TunelabError(
            f"{source}: {nproc} processes for the {prompts} prompts each step samples (micro_batch x grad_accum), "
            f"each prompt's completions in one process; use --nproc {prompts} or fewer, or raise micro_batch or "
            "grad_accum"
        )


def check_deepspeed_run(cfg, source: str) -> None:
    """Refuse run settings that tunelab does not support under DeepSpeed, naming the key."""
    refusal = objectives.lacking(cfg.objective.row, "zero", "use configs/accelerate/ddp.yaml or fsdp2.yaml")
    if refusal:
        raise TunelabError(f"{source}: {refusal}")
    # ZeRO partitions the optimizer state; tunelab's checkpoints hold it whole (gather_checkpoint does that for
    # FSDP only).
    for key, value, instead in [
        ("save_steps", cfg.run.save_steps, "set save_steps: 0"),
        ("resume", cfg.run.resume, "drop it"),
    ]:
        if value:
            raise TunelabError(
                f"{source}: {key}: tunelab's checkpoints are not written or read under DeepSpeed; use "
                f"configs/accelerate/fsdp2.yaml (ZeRO-3's sharding, with checkpoints) or {instead}"
            )


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


def run_launcher(cmd: list[str]) -> int:
    """Run `accelerate launch` (`cmd`), relaying its stderr through LauncherOutput; its exit status, or 2 (a
    usage error's, as one process returns) when the processes failed with tunelab's one-line errors."""
    import subprocess
    import sys

    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, bufsize=1, errors="replace")
    relay = LauncherOutput(lambda line: (sys.stderr.write(line), sys.stderr.flush()))
    assert proc.stderr is not None
    for line in proc.stderr:
        relay.feed(line)
    relay.close()
    status = proc.wait()
    return 2 if status and relay.errors else status


class LauncherOutput:
    """Relays what `accelerate launch` writes to stderr, line by line, leaving out what the launcher adds when a
    process fails (torchrun's log lines, its ChildFailedError traceback and failure report): each process has
    already said what went wrong, in tunelab's one line, and that line, printed by every process alike, is
    relayed once. A process's own traceback (a bug) is relayed as it is."""

    _LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")
    _RANK = re.compile(r"^\[rank\d+\]:\s?")

    def __init__(self, write):
        self.write = write
        self.errors: list[str] = []
        self._traceback: list[str] | None = None
        self._report_rules = 0  # "=====" lines of the launcher's failure report still to come
        # What the launcher said, held back: relayed at the end unless a process said what went wrong itself (a
        # process killed by a signal, out of memory say, says nothing; only the launcher's report names the signal).
        self._held: list[str] = []

    def feed(self, line: str) -> None:
        if self._report_rules:
            self._held.append(line)
            self._report_rules -= line.startswith("=====")
            return
        if self._traceback is not None:
            self._traceback.append(line)
            if line[:1].isspace() or line.startswith("Traceback"):
                return
            block, self._traceback = self._traceback, None
            if "ChildFailedError" in line:
                self._held += block
                self._report_rules = 2
            else:
                for kept in block:
                    self.write(kept)
            return
        if line.startswith("Traceback (most recent call last):"):
            self._traceback = [line]
            return
        if self._LOG.match(line):
            self._held.append(line)
            return
        text = self._RANK.sub("", line)
        if text.startswith("tunelab ") and ": error: " in text:
            if text in self.errors:
                return
            self.errors.append(text)
        self.write(text)

    def close(self) -> None:
        for kept in (self._traceback or []) + ([] if self.errors else self._held):
            self.write(kept)
        self._traceback, self._held = None, []


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
