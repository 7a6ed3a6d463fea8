"""The run's micro-batch schedule: a pure function of (data, batching settings, seed), so it can be resumed
from a step counter and counted ahead of time (steps, padded tokens) without touching a model."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Iterator, Protocol

import numpy as np
import torch

from ..config import BatchConfig
from ..data.examples import IGNORE, TokenizedData
from ..data.packing import Batch, SeqTargets, collate, epoch_micro_batches, fed_tokens


class BatchSource(Protocol):
    """What the loop (train/loop.run) trains from: each optimizer step's micro-batches, made when the step asks for
    them, and how one is fed to the loss module. `Schedule` plans the data's own sequences ahead of time (sft, dpo,
    orpo); a generating objective's source samples each step's sequences from the policy first (recipes/grpo.py),
    as TRL's GRPOTrainer overrides only its input preparation and loss. The loop never asks which one it has."""

    # Optimizer steps of the whole schedule.
    total_steps: int
    # Steps that go together: checkpoints, the time limit and a schedule fitted to it fall only on multiples of
    # it (1; a generated batch's num_iterations steps, a checkpoint between them could not resume the batch).
    unit: int

    def iterate(self, start: int, stop: int) -> Iterator[tuple[int, list[Any]]]:
        """(step, its micro-batches) for the steps in [start, stop), each made when its step comes."""

    # One micro-batch's summed loss, `forward(loss_fn, batch, device)` (the loop scales it by the step's
    # normaliser); None: a packed or padded data.packing.Batch, which train/loop.forward feeds.
    forward: Callable[[torch.nn.Module, Any, torch.device], torch.Tensor] | None

    def step_tokens(self, step: int) -> tuple[int, int, int]:
        """(padded, non-padding, loss) tokens of `step` over all ranks, once `iterate` has made it."""

    def step_normaliser(self, step: int) -> int:
        """What `step`'s summed loss is divided by, over all ranks."""

    def padded_tokens(self, steps: range) -> int:
        """Tokens fed (padding included) over `steps`: counted from the plan, or estimated (the ETA's numerator)."""

    def window_metrics(self) -> dict:
        """What a log line adds beside the loop's own fields for the steps since the last one (and starts anew)."""


@dataclass(frozen=True)
class BatchSpec:
    """The config's batch section and what the schedule adds to it: the shuffling seed, the padding token, and
    the objective's grouping."""

    batch: BatchConfig
    seed: int
    pad_id: int
    # Consecutive examples that train together (objectives.Objective.sequences: a preference pair's two): packed
    # into one row, each micro-batch says which sequence each target belongs to (Batch.seqs).
    group: int = 1
    # What a step's loss is the mean over (objectives.Objective.mean_over): `tokens` or `pairs` (groups).
    mean_over: str = "tokens"


class Schedule:
    """Optimizer step k consumes global micro-batches [k·grad_accum, (k+1)·grad_accum) of the epoch stream.

    Data-parallel ranks split each global micro-batch by rows: with `world` ranks the epoch is planned with
    micro_batch·world rows per micro-batch and rank r trains rows [r·micro_batch, (r+1)·micro_batch) of each.
    So N ranks of micro_batch m train, step for step, the batches that one process of micro_batch N·m trains,
    and every rank runs the same number of forward/backward passes per step (DDP and FSDP need that).
    """

    unit = 1  # any step may end a run or be checkpointed (BatchSource.unit)
    forward = None  # train/loop.forward feeds its batches

    def __init__(
        self, data: TokenizedData, spec: BatchSpec, epochs: float, max_steps: int | None, rank: int = 0, world: int = 1
    ):
        self.data, self.spec, self.rank, self.world = data, spec, rank, world
        self._epoch = lru_cache(maxsize=2)(self._plan_epoch)
        mask = np.concatenate([[0], np.cumsum(data.targets != IGNORE, dtype=np.int64)])
        self._loss_counts = mask[data.offsets[1:]] - mask[data.offsets[:-1]]
        # Each example's share of the step's normaliser: its loss tokens, or one per group (its first example).
        self._norm_counts = (
            self._loss_counts if spec.mean_over == "tokens" else (np.arange(len(data)) % spec.group == 0).astype(int)
        )
        per_epoch = len(self._epoch(0))
        self.steps_per_epoch = max(1, math.ceil(per_epoch / spec.batch.grad_accum))
        self.total_steps = max_steps if max_steps is not None else max(1, math.ceil(self.steps_per_epoch * epochs))
        # Every packed batch gets the run's largest sequence count as its attention-slot count. Why: the
        # slot count is an input shape of the compiled blocks, and the epoch's last batches (rows split by
        # fill_last_batch) hold fewer sequences, and a smaller count compiled every block again at the end
        # of the run (benchmarks/design-decisions_cpu_2026-11-22.md#one-attention-slot-count-per-run).
        # Padding slots cost attention work only. Taken over every rank's share, so all ranks agree.
        epochs_run = math.ceil(self.total_steps / self.steps_per_epoch)
        self.slots = (
            max(
                sum(len(row) for row in share)
                for epoch in range(epochs_run)
                for rows in self._epoch(epoch)
                for share in self._shares(rows)
            )
            if spec.batch.packing
            else 0
        )

    def _plan_epoch(self, epoch: int) -> list[list[list[int]]]:
        s = self.spec
        return epoch_micro_batches(
            self.data.lengths,
            s.batch.seq_len,
            s.batch.micro_batch * self.world,
            s.batch.packing,
            np.random.default_rng([s.seed, epoch]),
            s.group,
        )

    def _shares(self, rows: list[list[int]]) -> list[list[list[int]]]:
        m = self.spec.batch.micro_batch
        return [rows[r * m : (r + 1) * m] for r in range(self.world)]

    def global_rows(self, step: int) -> list[list[list[int]]]:
        """All ranks' micro-batches (each a list of rows of example indices) for optimizer step `step`.

        Steps never straddle epochs: an epoch's last step may have fewer micro-batches, which the loss
        normalisation (by the step's own loss-token count) handles exactly.
        """
        epoch, within = divmod(step, self.steps_per_epoch)
        ga = self.spec.batch.grad_accum
        return self._epoch(epoch)[within * ga : (within + 1) * ga]

    def step_rows(self, step: int) -> list[list[list[int]]]:
        """This rank's share of each of the step's micro-batches; an empty share (an epoch's last, short
        unpacked micro-batch) is `[]`."""
        return [self._shares(rows)[self.rank] for rows in self.global_rows(step)]

    def step_batches(self, step: int) -> list[Batch]:
        """This rank's micro-batches for `step`. An empty share becomes a batch without loss targets: it adds
        nothing to the loss or the gradients, and keeps this rank in step with the others' collectives."""
        s = self.spec
        out = []
        for rows, share in zip(self.global_rows(step), self.step_rows(step)):
            if share:
                out.append(
                    collate(self.data, share, s.batch.seq_len, s.pad_id, s.batch.packing, self.slots, s.group > 1)
                )
            else:
                first = collate(
                    self.data, rows[:1], s.batch.seq_len, s.pad_id, s.batch.packing, self.slots, s.group > 1
                )
                out.append(without_targets(first))
        return out

    def step_loss_tokens(self, step: int) -> int:
        """Loss tokens of `step` over all ranks, from the plan: the normaliser every rank divides by."""
        return int(sum(self._loss_counts[i] for rows in self.global_rows(step) for row in rows for i in row))

    def step_normaliser(self, step: int) -> int:
        """What `step`'s summed loss is divided by, over all ranks: its loss tokens, or its pairs."""
        return int(sum(self._norm_counts[i] for rows in self.global_rows(step) for row in rows for i in row))

    def _step_shares(self, step: int) -> list[list[list[int]]]:
        return [share for rows in self.global_rows(step) for share in self._shares(rows) if share]

    def step_tokens(self, step: int) -> tuple[int, int, int]:
        """(padded, non-padding, loss) tokens of `step` over all ranks, counted from the plan."""
        lengths, s = self.data.lengths, self.spec
        shares = self._step_shares(step)
        padded = fed_tokens(lengths, shares, s.batch.seq_len, s.batch.packing)
        nonpad = int(sum(int(lengths[row].sum()) for share in shares for row in share))
        return padded, nonpad, self.step_loss_tokens(step)

    def padded_tokens(self, steps: range) -> int:
        """Tokens fed (padding included) by all ranks over `steps`, counted from the plan without collating."""
        lengths, s = self.data.lengths, self.spec
        return sum(fed_tokens(lengths, self._step_shares(step), s.batch.seq_len, s.batch.packing) for step in steps)

    def iterate(self, start: int, stop: int) -> Iterator[tuple[int, list[Batch]]]:
        for step in range(start, stop):
            yield step, self.step_batches(step)

    def window_metrics(self) -> dict:
        return {}  # the loss module's own (loop: window_metrics) are all a log line adds


def without_targets(batch: Batch) -> Batch:
    """`batch` with no loss positions: its forward and backward run, and its loss and gradients are zero."""
    empty = np.zeros(0, dtype=np.int64)
    seqs = None if batch.seqs is None else SeqTargets(empty, empty)
    return replace(batch, loss_index=empty, loss_targets=empty, tokens_padded=0, tokens_nonpad=0, seqs=seqs)


def shard(items: list, rank: int, world: int) -> list:
    """Rank `rank`'s items of `items`, interleaved; a rank with one item fewer than others gets `None` in its
    place, so every rank runs the same number of passes."""
    per_rank = math.ceil(len(items) / world)
    mine = items[rank::world]
    return mine + [None] * (per_rank - len(mine))


class EvalBatches:
    """The evaluation set's micro-batches, batched as training batches are (packing, widths, slot count), fixed
    for the run: every evaluation sees the same batches. With several ranks each iterates its interleaved share
    (train/loop.eval_loss sums the loss and token counts over ranks)."""

    def __init__(self, data: TokenizedData, spec: BatchSpec, min_slots: int = 0, rank: int = 0, world: int = 1):
        self.data, self.spec, self.rank, self.world = data, spec, rank, world
        self.plan = epoch_micro_batches(
            data.lengths,
            spec.batch.seq_len,
            spec.batch.micro_batch,
            spec.batch.packing,
            np.random.default_rng([spec.seed, 0]),
            spec.group,
        )
        # At least the training batches' slot count, so compiled blocks see the shape they were compiled for.
        most = max(sum(len(row) for row in rows) for rows in self.plan)
        self.slots = max(min_slots, most) if spec.batch.packing else 0
        self.tokens_padded = fed_tokens(data.lengths, self.plan, spec.batch.seq_len, spec.batch.packing)
        self.tokens_loss = data.stats.tokens_loss

    def __len__(self) -> int:
        return len(self.plan)

    def __iter__(self) -> Iterator[Batch]:
        s = self.spec
        for rows in shard(self.plan, self.rank, self.world):
            batch = collate(
                self.data, rows or self.plan[0], s.batch.seq_len, s.pad_id, s.batch.packing, self.slots, s.group > 1
            )
            yield batch if rows else without_targets(batch)
