"""The run's micro-batch schedule: a pure function of (data, batching settings, seed), so it can be resumed
from a step counter and counted ahead of time (steps, padded tokens) without touching a model."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import numpy as np

from ..data.packing import Batch, collate, epoch_micro_batches, fed_tokens
from ..data.pipeline import TokenizedData


@dataclass(frozen=True)
class BatchSpec:
    seq_len: int
    micro_batch: int
    grad_accum: int
    packing: bool
    seed: int
    pad_id: int


class Schedule:
    """Optimizer step k consumes micro-batches [k·grad_accum, (k+1)·grad_accum) of the epoch stream.

    Data-parallel ranks take interleaved micro-batches of that stream (rank r: every world-th one).
    """

    def __init__(
        self, data: TokenizedData, spec: BatchSpec, epochs: float, max_steps: int | None, rank: int = 0, world: int = 1
    ):
        self.data, self.spec, self.rank, self.world = data, spec, rank, world
        self._epoch = lru_cache(maxsize=2)(self._plan_epoch)
        per_epoch = len(self._epoch(0))
        micro_per_step = spec.grad_accum * world
        self.steps_per_epoch = max(1, math.ceil(per_epoch / micro_per_step))
        self.total_steps = max_steps if max_steps is not None else max(1, math.ceil(self.steps_per_epoch * epochs))
        # Every packed batch gets the run's largest sequence count as its attention-slot count. Why: the
        # slot count is an input shape of the compiled blocks, and the epoch's last batches (rows split by
        # fill_last_batch) hold fewer sequences, and a smaller count compiled every block again at the end
        # of the run (benchmarks/design-decisions_cpu_2026-11-22.md#one-attention-slot-count-per-run).
        # Padding slots cost attention work only.
        epochs_run = math.ceil(self.total_steps / self.steps_per_epoch)
        self.slots = (
            max(sum(len(row) for row in rows) for epoch in range(epochs_run) for rows in self._epoch(epoch))
            if spec.packing
            else 0
        )

    def _plan_epoch(self, epoch: int) -> list[list[list[int]]]:
        s = self.spec
        return epoch_micro_batches(
            self.data.lengths, s.seq_len, s.micro_batch, s.packing, np.random.default_rng([s.seed, epoch])
        )

    def step_rows(self, step: int) -> list[list[list[int]]]:
        """This rank's micro-batches (each a list of rows of example indices) for optimizer step `step`.

        Steps never straddle epochs: an epoch's last step may have fewer micro-batches, which the loss
        normalisation (by the step's own loss-token count) handles exactly.
        """
        epoch, within = divmod(step, self.steps_per_epoch)
        plan = self._epoch(epoch)
        micro_per_step = self.spec.grad_accum * self.world
        chunk = plan[within * micro_per_step : (within + 1) * micro_per_step]
        mine = chunk[self.rank :: self.world]
        # With several ranks the last chunk can leave a rank without work; it repeats the chunk's first
        # micro-batch so every rank runs the same number of backward passes (DDP needs that).
        return mine if mine else chunk[:1]

    def step_batches(self, step: int) -> list[Batch]:
        s = self.spec
        return [collate(self.data, rows, s.seq_len, s.pad_id, s.packing, self.slots) for rows in self.step_rows(step)]

    def padded_tokens(self, steps: range) -> int:
        """Tokens fed (padding included) over `steps`, counted from the plan without collating."""
        lengths = self.data.lengths
        return sum(fed_tokens(lengths, self.step_rows(step), self.spec.seq_len, self.spec.packing) for step in steps)

    def iterate(self, start: int, stop: int) -> Iterator[tuple[int, list[Batch]]]:
        for step in range(start, stop):
            yield step, self.step_batches(step)


class EvalBatches:
    """The evaluation set's micro-batches, batched as training batches are (packing, widths, slot count), fixed
    for the run: every evaluation sees the same batches."""

    def __init__(self, data: TokenizedData, spec: BatchSpec, min_slots: int = 0):
        self.data, self.spec = data, spec
        self.plan = epoch_micro_batches(
            data.lengths, spec.seq_len, spec.micro_batch, spec.packing, np.random.default_rng([spec.seed, 0])
        )
        # At least the training batches' slot count, so compiled blocks see the shape they were compiled for.
        most = max(sum(len(row) for row in rows) for rows in self.plan)
        self.slots = max(min_slots, most) if spec.packing else 0
        self.tokens_padded = fed_tokens(data.lengths, self.plan, spec.seq_len, spec.packing)
        self.tokens_loss = data.stats.tokens_loss

    def __len__(self) -> int:
        return len(self.plan)

    def __iter__(self) -> Iterator[Batch]:
        s = self.spec
        for rows in self.plan:
            yield collate(self.data, rows, s.seq_len, s.pad_id, s.packing, self.slots)
