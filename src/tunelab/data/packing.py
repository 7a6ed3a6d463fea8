"""Micro-batches: padding-free packing (default) or length-grouped padding (fallback).

Packing concatenates examples into rows of exactly `seq_len` tokens. `position_ids` restart at 0 for each
example; transformers (>= 4.56 masking_utils.find_packed_sequence_indices) turns restarts into a
block-diagonal causal mask for SDPA and into varlen calls for flash-attention, so attention never crosses an
example boundary. Rows have a fixed shape, which keeps allocator reuse and torch.compile happy.

The unpacked fallback pads each micro-batch on the right to its longest row (rounded up to a multiple of
8), after grouping examples of similar length; right padding needs no attention mask under a causal mask.

A batch carries `loss_index` (flat positions with a target) computed here on the host, so the loss can
gather exactly those positions without a device->host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .examples import IGNORE, TokenizedData

# How many micro-batches of examples are sorted together when grouping by length: large enough to find
# similar lengths, small enough that batches stay random across the epoch.
GROUP_CHUNK = 64


@dataclass
class SeqLayout:
    """Where each packed sequence's tokens sit: `gather[s, j]` is the flat (B*T) index of token j of
    sequence s (padding slots repeat the sequence's first token); `valid` marks real slots. The inverse map,
    `slot[p]`, is the flat (S*L) slot of token p; `in_slot[p]` is False for row tails, which have none."""

    gather: np.ndarray  # (S, L) int64
    valid: np.ndarray  # (S, L) bool
    slot: np.ndarray  # (B*T,) int64
    in_slot: np.ndarray  # (B*T,) bool


SLOT_QUANTUM = 16


def slot_length(longest: int) -> int:
    """Slot length for a batch whose longest sequence is `longest` tokens, rounded up to a few sizes: every
    distinct activation size that a batch brings leaves differently-sized free blocks behind, and glibc's
    heap then grows instead of reusing them (peak RSS rose step after step over a whole run;
    benchmarks/design-decisions_cpu_2026-11-22.md#slot-length-rounded-to-a-few-sizes).
    The slot count needs no rounding: a run gives every batch its largest count (train/batches.Schedule)."""
    return -(-longest // SLOT_QUANTUM) * SLOT_QUANTUM


def slots_pay(sequences: int, longest: int, rows: int, width: int) -> bool:
    """Whether per-sequence attention slots cost less than attending over whole rows with a block-diagonal
    mask: attention work of the real sequences (each as long as the longest; padding slots and slot-length
    rounding left out) against rows x width²."""
    return sequences * longest**2 <= rows * width**2


def layout_from_lengths(row_seq_lengths: list[list[int]], width: int, min_slots: int = 0) -> SeqLayout:
    """Build the layout of a packed batch from each row's sequence lengths (the row tail is left out:
    its positions have no target, so their attention output is never used). At least `min_slots` slots:
    a run passes its largest sequence count so that every batch has the same slot count (see Schedule)."""
    starts, lengths = [], []
    for r, seqs in enumerate(row_seq_lengths):
        at = r * width
        for n in seqs:
            starts.append(at)
            lengths.append(n)
            at += n
    # Padding slots are invalid everywhere.
    longest = slot_length(max(lengths, default=1))  # rows all empty: padding slots only
    padding_slots = max(len(lengths), min_slots) - len(lengths)
    lengths += [0] * padding_slots
    starts += [0] * padding_slots
    offsets = np.arange(longest)
    lengths_arr = np.asarray(lengths)[:, None]
    valid = offsets[None, :] < lengths_arr
    gather = np.asarray(starts)[:, None] + np.where(valid, offsets[None, :], 0)
    tokens = len(row_seq_lengths) * width
    slot = np.zeros(tokens, dtype=np.int64)
    in_slot = np.zeros(tokens, dtype=bool)
    slot[gather[valid]] = np.flatnonzero(valid)
    in_slot[gather[valid]] = True
    return SeqLayout(gather.astype(np.int64), valid, slot, in_slot)


@dataclass
class SeqTargets:
    """Which sequence each loss target belongs to, for objectives that score sequences (a preference pair's two):
    `seq[k]` is the sequence (0-based, in the batch's order) of loss target k, `examples[s]` the example index
    of sequence s. Sequences without targets (empty rows) are not counted."""

    seq: np.ndarray  # (K,) int64
    examples: np.ndarray  # (S,) int64

    @property
    def count(self) -> int:
        return len(self.examples)


@dataclass
class Batch:
    input_ids: np.ndarray  # (B, T) int64
    position_ids: np.ndarray | None  # (B, T) int64 when packed
    loss_index: np.ndarray  # (K,) int64 flat indices into B*T
    loss_targets: np.ndarray  # (K,) int64
    tokens_padded: int
    tokens_nonpad: int
    layout: SeqLayout | None = None  # packed rows: per-sequence attention slots, when cheaper than a T x T mask
    seqs: SeqTargets | None = None  # objectives that score whole sequences (preference pairs)

    @property
    def tokens_loss(self) -> int:
        return len(self.loss_index)


def epoch_rows(
    lengths: np.ndarray, seq_len: int, packing: bool, rng: np.random.Generator, group: int = 1
) -> list[list[int]]:
    """The example indices of each row, in training order, for one epoch. `group` consecutive examples (a
    preference pair's chosen and rejected sequences) are placed as one unit, in the same row."""
    order = rng.permutation(len(lengths) // group)
    if not packing:
        return [[int(i)] for i in order]
    rows: list[list[int]] = []
    current: list[int] = []
    used = 0
    # Next-fit: an example that does not fit closes the row. Examples are never split, so no example is
    # trained without its prompt.
    for unit in order:
        members = [int(unit) * group + k for k in range(group)]
        n = int(sum(lengths[i] for i in members))
        if used + n > seq_len and current:
            rows.append(current)
            current, used = [], 0
        current.extend(members)
        used += n
    if current:
        rows.append(current)
    return rows


def epoch_micro_batches(
    lengths: np.ndarray, seq_len: int, micro_batch: int, packing: bool, rng: np.random.Generator, group: int = 1
) -> list[list[list[int]]]:
    """Micro-batches (lists of rows) for one epoch. Unpacked rows are grouped by length to cut padding."""
    rows = epoch_rows(lengths, seq_len, packing, rng, group)
    if not packing:
        chunk = micro_batch * GROUP_CHUNK
        grouped: list[list[int]] = []
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            grouped.extend(sorted(part, key=lambda r: int(lengths[r[0]])))
        rows = grouped
    else:
        rows = fill_last_batch(rows, micro_batch, group)
    batches = [rows[i : i + micro_batch] for i in range(0, len(rows), micro_batch)]
    if not packing:
        rng.shuffle(batches)
    return batches


def fill_last_batch(rows: list[list[int]], micro_batch: int, group: int = 1) -> list[list[int]]:
    """Split packed rows at the end of the epoch in two until the row count is a multiple of `micro_batch`.

    Why: a last micro-batch with fewer rows is a new input shape, and compiled blocks compile again for it
    (benchmarks/design-decisions_cpu_2026-11-22.md#last-batch-filled-to-the-micro-batch). A split row costs a
    little padding instead; every example is still used once, and the number of micro-batches is unchanged.
    Where too few rows hold two examples (a small evaluation set), empty rows fill the last micro-batch.
    """
    missing = -len(rows) % micro_batch
    out: list[list[int]] = []
    for row in reversed(rows):
        if missing and len(row) > group:
            half = len(row) // group // 2 * group  # a group (a pair) stays in one row
            out += [row[half:], row[:half]]
            missing -= 1
        else:
            out.append(row)
    # Rows of one example each cannot be split: empty rows (all padding, no targets) make up the rest.
    return out[::-1] + [[] for _ in range(missing)]


def collate(
    data: TokenizedData,
    rows: list[list[int]],
    seq_len: int,
    pad_id: int,
    packing: bool,
    min_slots: int = 0,
    sequences: bool = False,
) -> Batch:
    """Build one micro-batch's arrays on the host (`min_slots`: see layout_from_lengths; `sequences`: also
    which sequence each target belongs to, Batch.seqs)."""
    offsets = data.offsets
    row_lengths = [sum(int(offsets[i + 1] - offsets[i]) for i in row) for row in rows]
    width = batch_width(row_lengths, seq_len, packing)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    targets = np.full((len(rows), width), IGNORE, dtype=np.int64)
    positions = np.zeros((len(rows), width), dtype=np.int64) if packing else None
    row_seq_lengths: list[list[int]] = []
    for r, row in enumerate(rows):
        at = 0
        row_seq_lengths.append([int(offsets[i + 1] - offsets[i]) for i in row])
        for i in row:
            start, end = int(offsets[i]), int(offsets[i + 1])
            n = end - start
            ids[r, at : at + n] = data.ids[start:end]
            targets[r, at : at + n] = data.targets[start:end]
            if positions is not None:
                positions[r, at : at + n] = np.arange(n)
            at += n
        if positions is not None and at < width:
            # The tail is its own "sequence" (positions restart), so no real token can attend to it.
            positions[r, at:] = np.arange(width - at)
    flat = targets.reshape(-1)
    loss_index = np.flatnonzero(flat != IGNORE)
    layout = None
    seq_lengths = [n for seqs in row_seq_lengths for n in seqs]
    if packing and slots_pay(len(seq_lengths), max(seq_lengths, default=0), len(rows), width):
        layout = layout_from_lengths(row_seq_lengths, width, min_slots)
    seqs = seq_targets(data, rows, width, loss_index) if sequences else None
    return Batch(ids, positions, loss_index, flat[loss_index], ids.size, int(sum(row_lengths)), layout, seqs)


def seq_targets(data: TokenizedData, rows: list[list[int]], width: int, loss_index: np.ndarray) -> SeqTargets:
    """Each loss target's sequence, from where each sequence starts in the flat (B*T) batch."""
    starts, examples = [], []
    for r, row in enumerate(rows):
        at = r * width
        for i in row:
            starts.append(at)
            examples.append(i)
            at += int(data.offsets[i + 1] - data.offsets[i])
    seq = np.searchsorted(np.asarray(starts, dtype=np.int64), loss_index, side="right") - 1
    return SeqTargets(seq.astype(np.int64), np.asarray(examples, dtype=np.int64))


def batch_width(row_lengths: list[int], seq_len: int, packing: bool) -> int:
    """Packed rows are always seq_len; padded ones the longest row rounded up to 8 (tensor-core friendly)."""
    if packing:
        return seq_len
    return min(seq_len, -(-max(row_lengths) // 8) * 8)


def fed_tokens(lengths: np.ndarray, micro_batches: list[list[list[int]]], seq_len: int, packing: bool) -> int:
    """Tokens fed to the model, padding included, for these micro-batches (counted without collating)."""
    total = 0
    for batch in micro_batches:
        row_lengths = [int(lengths[row].sum()) for row in batch]
        total += batch_width(row_lengths, seq_len, packing) * len(batch)
    return total


def packing_efficiency(
    lengths: np.ndarray, seq_len: int, micro_batch: int, packing: bool, seed: int, group: int = 1
) -> float:
    """Real tokens over fed tokens for one epoch's batching (1.0 = no padding)."""
    batches = epoch_micro_batches(lengths, seq_len, micro_batch, packing, np.random.default_rng([seed, 0]), group)
    return float(lengths.sum()) / fed_tokens(lengths, batches, seq_len, packing)
