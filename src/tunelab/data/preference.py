"""Preference pairs -> tokenized examples: each row {prompt, chosen, rejected} becomes two examples, the chosen
sequence at index 2i and the rejected one at 2i + 1, each its prompt then its response, targets shifted as for
supervised rows (data/pipeline.py). Packing keeps a pair's two sequences together, as two documents of one row
(data/packing.py, `group`).

A pair must fit one packed row, so each side is cut to seq_len // 2 tokens; a pair whose cut leaves either
response without a token is dropped (counted, as supervised rows are), and none left is an error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import hub
from ..errors import TunelabError
from .formats import check_fields, render_pair_side
from .pipeline import (
    IGNORE,
    DatasetStats,
    DataSpec,
    TokenizedData,
    _fingerprint,
    line_limit,
    map_rows,
    read_hub_rows,
    read_rows,
)

FORMAT = "preference"
SIDES = ("chosen", "rejected")


def prepare_pairs(spec: DataSpec, tokenizer) -> TokenizedData:
    """Read, check, render, tokenize (cached by datasets, as supervised rows are) and cut one file of pairs."""
    if hub.is_hub_data(spec.path):
        rows, label, identity = read_hub_rows(hub.parse_data(spec.path), FORMAT, spec.max_examples)
    else:
        path = Path(spec.path)
        rows = read_rows(path, FORMAT, spec.max_examples, line_limit(spec.seq_len), spec.key)
        stat = path.stat()
        label, identity = str(path), [str(path.resolve()), stat.st_size, stat.st_mtime_ns]
    eos = tokenizer.eos_token or ""
    bos = (
        [tokenizer.bos_token_id]
        if getattr(tokenizer, "add_bos_token", False) and tokenizer.bos_token_id is not None
        else []
    )
    side_len = spec.seq_len // 2

    def tokenize(batch, indices):
        out = {f"{side}_{k}": [] for side in SIDES for k in ("ids", "targets", "truncated")}
        keys = list(batch.keys())
        for n, index in enumerate(indices):
            row = {k: batch[k][n] for k in keys}
            check_fields(FORMAT, row, f"{label}: row {index + 1}")
            for side in SIDES:
                segments = render_pair_side(spec.format, spec.template, row, side, eos, tokenizer)
                pieces = tokenizer([s.text for s in segments], add_special_tokens=False)["input_ids"]
                ids, trainable = list(bos), [False] * len(bos)
                for seg, piece in zip(segments, pieces):
                    ids.extend(piece)
                    trainable.extend([seg.trainable] * len(piece))
                out[f"{side}_truncated"].append(len(ids) > side_len)
                ids, trainable = ids[:side_len], trainable[:side_len]
                targets = [ids[t + 1] if trainable[t + 1] else IGNORE for t in range(len(ids) - 1)] + [IGNORE]
                out[f"{side}_ids"].append(ids)
                out[f"{side}_targets"].append(targets)
        return out

    tokenized = map_rows(rows, tokenize, _fingerprint([FORMAT, identity], spec, tokenizer), "tokenizing pairs")
    return interleave(tokenized, label)


def interleave(tokenized, label: str) -> TokenizedData:
    """The pairs as examples 2i (chosen) and 2i + 1 (rejected); pairs with an emptied response dropped."""
    sides = {side: [np.asarray(x, dtype=np.int32) for x in tokenized[f"{side}_ids"]] for side in SIDES}
    targets = {side: [np.asarray(x, dtype=np.int32) for x in tokenized[f"{side}_targets"]] for side in SIDES}
    cut = {side: np.asarray(tokenized[f"{side}_truncated"], dtype=bool) for side in SIDES}
    pairs = len(sides["chosen"])
    keep = np.array([all((targets[side][i] != IGNORE).any() for side in SIDES) for i in range(pairs)], dtype=bool)
    if not keep.any():
        raise TunelabError(
            f"{label}: no pair keeps a response token after cutting each side to seq_len // 2; raise seq_len"
        )
    kept = np.flatnonzero(keep)
    ids = [sides[side][i] for i in kept for side in SIDES]
    tgts = [targets[side][i] for i in kept for side in SIDES]
    truncated = np.array([cut[side][i] for i in kept for side in SIDES], dtype=bool)
    lengths = np.array([len(x) for x in ids], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat_targets = np.concatenate(tgts)
    stats = DatasetStats(
        rows=pairs,
        examples=len(ids),
        truncated=int(truncated.sum()),
        dropped=int((~keep).sum()),
        tokens_nonpad=int(lengths.sum()),
        tokens_loss=int((flat_targets != IGNORE).sum()),
        max_len=int(lengths.max()),
        mean_len=float(lengths.mean()),
    )
    return TokenizedData(np.concatenate(ids), flat_targets, offsets, stats, np.repeat(kept, 2), truncated)
