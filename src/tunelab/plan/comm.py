"""Bytes each GPU sends per optimizer step in a data-parallel run, for the shipped Accelerate configs
(configs/accelerate/: ddp, zero2, zero3; FSDP2 with reshard_after_forward moves what ZeRO-3 moves).

Derivation (ring collectives over N ranks; Rajbhandari et al. 2020, arXiv 1910.02054, Sec. 7): a
reduce-scatter or an all-gather of B bytes sends (N-1)/N·B per rank, an all-reduce is one of each,
2·(N-1)/N·B. With G the trainable gradients' bytes (fp32: tunelab keeps trainable weights and their
gradients in fp32), T the trainable weights' bytes and W all weights' bytes as FSDP2 gathers them (in the
compute dtype: train/distributed.shard gives fully_shard a MixedPrecisionPolicy with param_dtype = the compute
dtype and fp32 reductions; DeepSpeed's ZeRO-3 under configs/accelerate/zero3.yaml, mixed_precision 'no',
gathers fp32 trainable weights instead), and `grad_accum` micro-batches per step:

- DDP: gradients accumulate locally under `no_sync` and are all-reduced once, after the last micro-batch:
  2·(N-1)/N·G.
- ZeRO-2: gradients are partitioned, so they are reduce-scattered after every micro-batch's backward (Accelerate
  skips `no_sync` for stage >= 2), and each rank's updated shard of the trainable weights is all-gathered
  after the optimizer step: grad_accum·(N-1)/N·G + (N-1)/N·T.
- ZeRO-3 / FSDP2: every micro-batch all-gathers each layer's weights for forward and again for backward, and
  reduce-scatters the gradients (FSDP2 under `no_sync` defers that to the last micro-batch; counted per
  micro-batch, as ZeRO-3 does it): grad_accum·((N-1)/N·2·W + (N-1)/N·G). Updated shards stay sharded.

Latency terms and overlap with compute are not modeled: this is volume, not time.
"""

from __future__ import annotations

from .arch import Arch
from .job import Job
from .memory import TRAINABLE_BYTES, Layout, frozen_weight_bytes, trainable_params


def step_bytes(arch: Arch, job: Job, s: Layout, grad_accum: int) -> float:
    """Bytes one GPU sends per optimizer step under `s.sharding` on `s.world` GPUs (0 for one GPU)."""
    n = max(1, s.world)
    if n == 1 or s.sharding == "single":
        return 0.0
    share = (n - 1) / n
    params = trainable_params(arch, job, s)
    trainable = params * TRAINABLE_BYTES
    if job.method.trains_base:
        weights = arch.total_params * s.compute_bytes
    else:
        weights = frozen_weight_bytes(arch, job.adapter.quant, s.compute_bytes) + params * s.compute_bytes
    if s.sharding == "ddp":
        return 2 * share * trainable
    if s.sharding == "zero2":
        return grad_accum * share * trainable + share * trainable
    if s.sharding == "zero3":
        return grad_accum * (2 * share * weights + share * trainable)
    raise ValueError(f"unknown sharding {s.sharding!r}")
