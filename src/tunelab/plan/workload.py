"""What a run feeds the model: examples, tokens (padded, non-padding, loss), micro-batches, optimizer steps
and checkpoints. Counting is done the way `tunelab train` batches (tunelab.data.packing, train.batches):
steps never straddle epochs, an epoch is ceil(micro_batches / (grad_accum x data-parallel ranks)) steps.

Two sources of token lengths:
- a real dataset (`data.path`): the lengths after the template and truncation, batched by the same
  functions `train` uses, so padded tokens are exact for the first epoch's order;
- assumed lengths (`--examples N --mean-tokens M`): every example is M tokens long, which makes the
  counts closed-form; said as such in the output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..config import BatchConfig
from ..errors import TunelabError

# Rounding of a padded micro-batch's width (tunelab.data.packing.batch_width pads to a multiple of 8).
PAD_MULTIPLE = 8


@dataclass(frozen=True)
class Batching:
    """The config's batch section as plan counts it: on how many data-parallel processes, shuffled by which seed,
    with how many consecutive examples packed together (objectives.Objective.sequences: a pair's two)."""

    batch: BatchConfig
    data_parallel: int = 1
    seed: int = 42
    group: int = 1
    products_len: int = 256  # the longest slot the run computes as explicit products (runtime.slot_max_len)

    @property
    def micro_batches_per_step(self) -> int:
        return self.batch.grad_accum * self.data_parallel


@dataclass(frozen=True)
class Lengths:
    """Token lengths of the training examples. `lengths` is None for assumed (all-equal) lengths."""

    examples: int
    mean_tokens: float
    mean_loss_tokens: float
    source: str
    lengths: np.ndarray | None = None
    truncated: int = 0
    dropped: int = 0
    # The evaluation examples (eval.split or eval.path), batched as training batches; None: no evaluation.
    held_out: Lengths | None = None


@dataclass(frozen=True)
class EpochCounts:
    micro_batches: int
    rows: int  # sequences fed: packed rows, or examples when unpacked
    tokens_padded: int
    tokens_nonpad: int
    tokens_loss: int
    widest_row: int  # the longest micro-batch width: what sizes activation memory
    # Packed micro-batches whose attention runs in per-sequence slots (data.packing.collate): the run's slot
    # count and slot length, which size attention's saved tensors. 0 when attention runs over whole rows.
    slots: int = 0
    slot_len: int = 0
    # Query-key pairs of the epoch's attention on the slot path (the CPU's, model/attention.py), where collate
    # decides per micro-batch: one whose slots pay computes the run's slot count x its own slot length squared
    # (padding slots and the causal half included: explicit products compute the square), counted in
    # `slot_pairs`; the others run over whole rows under a block-diagonal mask, rows x width squared, counted in
    # `masked_pairs`; `scored_pairs`, the slot pairs of micro-batches whose slots are short enough for
    # explicit products (runtime.slot_products: they write their scores out). All 0 when unpacked.
    slot_pairs: int = 0
    masked_pairs: int = 0
    scored_pairs: int = 0


@dataclass(frozen=True)
class Workload:
    batching: Batching
    lengths: Lengths
    epoch: EpochCounts
    epochs_run: float  # epochs actually covered (max_steps can cut a run short)
    steps_per_epoch: int
    optimizer_steps: int
    tokens_upper_bound: int  # examples x seq_len x epochs: the naive padded figure of the seed documents

    def total(self, per_epoch: int) -> int:
        return round(per_epoch * self.epochs_run)

    @property
    def tokens_padded(self) -> int:
        return self.total(self.epoch.tokens_padded)

    @property
    def tokens_nonpad(self) -> int:
        return self.total(self.epoch.tokens_nonpad)

    @property
    def tokens_loss(self) -> int:
        return self.total(self.epoch.tokens_loss)

    @property
    def padding_fraction(self) -> float:
        return 1 - self.epoch.tokens_nonpad / self.epoch.tokens_padded

    @property
    def loss_tokens_per_micro_batch(self) -> float:
        return self.epoch.tokens_loss / self.epoch.micro_batches


def assumed_lengths(examples: int, mean_tokens: float, loss_fraction: float) -> Lengths:
    return Lengths(
        examples,
        mean_tokens,
        mean_tokens * loss_fraction,
        source=f"assumed: {examples} examples x {mean_tokens:g} tokens each (no dataset given)",
    )


def epoch_counts(lengths: Lengths, b: Batching) -> EpochCounts:
    if lengths.lengths is not None:
        return _counted(lengths, b)
    # All examples have the same length L (clipped to seq_len as truncation would).
    n, L = lengths.examples, min(lengths.mean_tokens, b.batch.seq_len)
    if b.batch.packing:
        per_row = max(1, int(b.batch.seq_len // L))  # next-fit packing of equal lengths fills rows exactly this far
        rows = math.ceil(n / per_row)
        width = b.batch.seq_len
    else:
        rows = n
        width = min(b.batch.seq_len, math.ceil(L / PAD_MULTIPLE) * PAD_MULTIPLE)
    # Truncation keeps an example's first seq_len tokens: the prompt comes first, the loss tokens after it.
    loss = max(0.0, L - (lengths.mean_tokens - lengths.mean_loss_tokens))
    if loss == 0:
        raise TunelabError(
            f"the assumed examples of {lengths.mean_tokens:g} tokens (--mean-tokens) start with "
            f"{lengths.mean_tokens - lengths.mean_loss_tokens:g} prompt tokens (--loss-fraction), which fill seq_len "
            f"{b.batch.seq_len}, so truncation leaves no example a token to learn from; raise seq_len or lower --mean-tokens"
        )
    counts = EpochCounts(
        math.ceil(rows / b.batch.micro_batch), rows, rows * width, round(n * L), round(n * loss), width
    )
    sequences = min(n, per_row * b.batch.micro_batch) if b.batch.packing else 0
    counts = _with_slots(counts, sequences, math.ceil(L), b)
    batches = [(sequences, math.ceil(L), min(b.batch.micro_batch, rows), width)] * counts.micro_batches
    return replace(counts, **slot_pairs(batches, sequences, b.batch.packing, b.products_len))


def _with_slots(counts: EpochCounts, sequences: int, longest: int, b: Batching) -> EpochCounts:
    """`counts` with the slot shape that collate gives a packed micro-batch of `sequences` (the run's most)
    whose longest is `longest` tokens, where slots pay."""
    from ..data.packing import slot_length, slots_pay

    if not b.batch.packing or not slots_pay(sequences, longest, b.batch.micro_batch, b.batch.seq_len):
        return counts
    return replace(counts, slots=sequences, slot_len=slot_length(longest))


def slot_pairs(
    batches: list[tuple[int, int, int, int]], run_slots: int, packing: bool, products_len: int
) -> dict[str, int]:
    """The pairs the slot path computes over (sequences, longest, rows, width) micro-batches, as
    EpochCounts' slot_pairs, masked_pairs and scored_pairs (slots up to `products_len` long); none when unpacked
    (padded rows attend over their width, which plan counts apart)."""
    from ..data.packing import slot_length, slots_pay

    pairs = {"slot_pairs": 0, "masked_pairs": 0, "scored_pairs": 0}
    for sequences, longest, rows, width in batches if packing else []:
        if slots_pay(sequences, longest, rows, width):
            length = slot_length(longest)
            pairs["slot_pairs"] += run_slots * length**2
            pairs["scored_pairs"] += run_slots * length**2 if length <= products_len else 0
        else:
            pairs["masked_pairs"] += rows * width**2
    return pairs


def _counted(lengths: Lengths, b: Batching) -> EpochCounts:
    """The first epoch batched exactly as `train` batches it (same functions, same seed)."""
    from ..data.packing import batch_width, epoch_micro_batches, slot_length, slots_pay

    arr = np.minimum(lengths.lengths, b.batch.seq_len)
    batches = epoch_micro_batches(
        arr, b.batch.seq_len, b.batch.micro_batch, b.batch.packing, np.random.default_rng([b.seed, 0]), b.group
    )
    padded = widest = rows = sequences = 0
    shapes = []
    for batch in batches:
        width = batch_width([int(arr[row].sum()) for row in batch], b.batch.seq_len, b.batch.packing)
        padded += width * len(batch)
        widest = max(widest, width)
        rows += len(batch)
        count = sum(len(row) for row in batch)
        sequences = max(sequences, count)
        longest = max((int(arr[row].max()) for row in batch if len(row)), default=0)  # empty rows fill a last batch
        shapes.append((count, longest, len(batch), width))
    loss = round(lengths.examples * lengths.mean_loss_tokens)
    counts = EpochCounts(len(batches), rows, padded, int(arr.sum()), loss, widest)
    # collate decides per micro-batch, from that batch's own sequences, and gives a paying batch the run's slot
    # count: the slot shape memory meets is the longest slot of the batches that pay, even where the run's most
    # sequences at its longest would not pay (rows of varied length: the embedded model's 36% gap,
    # benchmarks/plan-accuracy/checkpoint-variants_epyc-avx512bf16-2c_2026-12-07.md).
    paying = [longest for count, longest, n, width in shapes if slots_pay(count, longest, n, width)]
    if b.batch.packing and paying:
        counts = replace(counts, slots=sequences, slot_len=slot_length(max(paying)))
    return replace(counts, **slot_pairs(shapes, sequences, b.batch.packing, b.products_len))


def build(lengths: Lengths, b: Batching, epochs: float, max_steps: int | None = None) -> Workload:
    return from_epoch(lengths, b, epoch_counts(lengths, b), epochs, max_steps)


def from_epoch(lengths: Lengths, b: Batching, epoch: EpochCounts, epochs: float, max_steps: int | None) -> Workload:
    """The run's steps from one epoch's counts (another stack's batching: plan/hfstack.py)."""
    steps_per_epoch = max(1, math.ceil(epoch.micro_batches / b.micro_batches_per_step))
    steps = max_steps if max_steps is not None else max(1, math.ceil(steps_per_epoch * epochs))
    epochs_run = epochs if max_steps is None else steps / steps_per_epoch
    upper = round(lengths.examples * b.batch.seq_len * epochs_run)
    return Workload(b, lengths, epoch, epochs_run, steps_per_epoch, steps, upper)


@dataclass(frozen=True)
class Checkpoints:
    written: int  # resumable checkpoints during the run (train saves at step % save_steps == 0, before the end)
    kept: int  # on disk at the end (save_total_limit rotates older ones away)
    final: int = 1  # the final adapter/model save


def checkpoints(optimizer_steps: int, save_steps: int, save_total_limit: int) -> Checkpoints:
    written = (optimizer_steps - 1) // save_steps if save_steps > 0 else 0
    return Checkpoints(written, min(written, save_total_limit))


def split_assumed(lengths: Lengths, fraction: float) -> Lengths:
    """Assumed lengths with round(fraction x examples) held out for evaluation, as eval.split holds them out."""
    held = round(fraction * lengths.examples)
    if held < 1 or held >= lengths.examples:
        raise TunelabError(
            f"eval.split {fraction} of {lengths.examples} examples holds out {held}; both sides need at least one"
        )
    evaluation = replace(
        lengths, examples=held, source=f"assumed: {held} held-out examples x {lengths.mean_tokens:g} tokens each"
    )
    return replace(
        lengths,
        examples=lengths.examples - held,
        source=f"{lengths.source}, {held} of them held out (eval.split {fraction:g})",
        held_out=evaluation,
    )


@dataclass(frozen=True)
class Evaluations:
    count: int  # evaluations in the run: every `every` steps and at the end (early stopping can make fewer)
    tokens_padded: int  # fed per evaluation
    tokens_loss: int  # loss tokens per evaluation
    widest_row: int


def evaluations(held_out: Lengths, b: Batching, optimizer_steps: int, every: int) -> Evaluations:
    """What train/loop.py evaluates: the held-out set batched as training batches, at every multiple of
    `every` steps (0: none) and at the last step."""
    counts = epoch_counts(replace(held_out, held_out=None), replace(b, data_parallel=1))
    n = optimizer_steps // every + (optimizer_steps % every != 0) if every else 1
    return Evaluations(n, counts.tokens_padded, counts.tokens_loss, counts.widest_row)
