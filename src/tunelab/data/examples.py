"""Tokenized examples as flat arrays (`TokenizedData`), the statistics of what the data became (`DatasetStats`), and
selections and concatenations of them: what the data modules hand to packing, training and plan.

Each example stores `input_ids` and `targets`, where targets are already shifted: `targets[t]` is the token
the model must predict at position t (`input_ids[t+1]` when that token is trainable), else IGNORE. Shifting
per example, before packing, is what keeps a packed row from asking the last token of one sequence to
predict the first token of the next.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

IGNORE = -100


@dataclass
class DatasetStats:
    rows: int  # rows read from the file (after max_examples)
    examples: int  # kept for training
    truncated: int  # longer than seq_len, cut to it
    dropped: int  # no loss token left after truncation
    tokens_nonpad: int  # kept examples' tokens
    tokens_loss: int  # kept examples' tokens with a loss target
    max_len: int
    mean_len: float

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class TokenizedData:
    """Examples as one flat token array plus offsets: O(1) slicing without Python lists per example."""

    ids: np.ndarray  # int32, all examples concatenated
    targets: np.ndarray  # int32, same layout
    offsets: np.ndarray  # int64, len = examples + 1
    stats: DatasetStats
    rows: np.ndarray  # int64, each example's row number (0-based) in its file
    truncated: np.ndarray  # bool, each example was cut to seq_len

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1


def stats_of(lengths: np.ndarray, targets: np.ndarray, truncated: np.ndarray, rows: int, dropped: int) -> DatasetStats:
    """The statistics of examples of `lengths` with these flat `targets`; `rows` and `dropped` as the caller counts."""
    return DatasetStats(
        rows=rows,
        examples=len(lengths),
        truncated=int(truncated.sum()),
        dropped=dropped,
        tokens_nonpad=int(lengths.sum()),
        tokens_loss=int((targets != IGNORE).sum()),
        max_len=int(lengths.max()),
        mean_len=float(lengths.mean()),
    )


def loss_tokens(data: TokenizedData) -> np.ndarray:
    """Each example's count of tokens with a target."""
    counted = np.concatenate([[0], np.cumsum(data.targets != IGNORE)])
    return counted[data.offsets[1:]] - counted[data.offsets[:-1]]


def select(data: TokenizedData, index: np.ndarray, rows: int, dropped: int = 0) -> TokenizedData:
    """The examples at `index` (in that order), with their statistics; `rows` and `dropped` as the caller counts."""
    starts, ends = data.offsets[:-1][index], data.offsets[1:][index]
    lengths = ends - starts
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    # Each kept token's place in `data`: its place in the selection moved by its example's start there.
    flat = np.arange(offsets[-1], dtype=np.int64) + np.repeat(starts - offsets[:-1], lengths)
    ids, targets = data.ids[flat], data.targets[flat]
    truncated = data.truncated[index]
    stats = stats_of(lengths, targets, truncated, rows, dropped)
    return TokenizedData(ids, targets, offsets, stats, data.rows[index], truncated)


def concat(parts: list[TokenizedData]) -> TokenizedData:
    """Examples of several datasets one after another; rows and dropped add up."""
    lengths = np.concatenate([p.lengths for p in parts])
    targets = np.concatenate([p.targets for p in parts])
    truncated = np.concatenate([p.truncated for p in parts])
    stats = stats_of(lengths, targets, truncated, sum(p.stats.rows for p in parts), sum(p.stats.dropped for p in parts))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = np.concatenate([p.ids for p in parts])
    return TokenizedData(ids, targets, offsets, stats, np.concatenate([p.rows for p in parts]), truncated)
