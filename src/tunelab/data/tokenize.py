"""Rows -> tokenized sequences, for supervised rows (data/pipeline.py) and preference pairs (data/pairs.py)
alike: each row's fields checked, rendered into segments by its format (data/formats.py), each segment tokenized,
the prompt masked, the sequence cut to its length and its targets shifted (data/examples.py).

The mapping is cached by `datasets` under a fingerprint of everything that decides its output: the source's
identity (data/read.py), the data settings, the tokenizer and, for conversations, its chat template; so a second
run (or `plan` after `train`) re-tokenizes nothing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Any, Callable

import numpy as np

from ..errors import TunelabError
from .examples import IGNORE, TokenizedData, stats_of
from .formats import CONVERSATION_FORMATS, Segment, check_fields, effective_chat_template

# Bump when tokenization output changes, so old caches are not reused.
CACHE_VERSION = "1"


def bos_ids(tokenizer) -> list[int]:
    """The tokens each sequence starts with: the BOS token where the tokenizer adds one."""
    if getattr(tokenizer, "add_bos_token", False) and tokenizer.bos_token_id is not None:
        return [tokenizer.bos_token_id]
    return []


def encode(
    segments: list[Segment], tokenizer, bos: list[int], max_len: int, train_on_inputs: bool = False
) -> tuple[list[int], list[int], bool]:
    """(input ids, shifted targets, whether it was cut) of one rendered sequence: `bos`, then each segment
    tokenized on its own (so a prompt's last token never merges with the response's first), cut to `max_len`. A
    token is trained when its segment is, or every token is with `train_on_inputs`."""
    pieces = tokenizer([s.text for s in segments], add_special_tokens=False)["input_ids"]
    ids, trainable = list(bos), [train_on_inputs] * len(bos)
    for seg, piece in zip(segments, pieces):
        ids.extend(piece)
        trainable.extend([seg.trainable or train_on_inputs] * len(piece))
    cut = len(ids) > max_len
    ids, trainable = ids[:max_len], trainable[:max_len]
    targets = [ids[t + 1] if trainable[t + 1] else IGNORE for t in range(len(ids) - 1)] + [IGNORE]
    return ids, targets, cut


def tokenize_rows(
    rows, fmt: str, label: str, encode_row: Callable[[dict[str, Any]], dict[str, Any]], fingerprint: str, desc: str
):
    """`rows` (a `datasets.Dataset`) mapped row by row, each checked for `fmt`'s fields (errors name `label` and the
    row), then `encode_row(row)` -> {column: value}; cached under `fingerprint`. A TunelabError raised inside
    surfaces as itself (datasets wraps errors raised inside map)."""

    def batch(columns, indices):
        out: dict[str, list] = {}
        for n, index in enumerate(indices):
            row = {k: values[n] for k, values in columns.items()}
            check_fields(fmt, row, f"{label}: row {index + 1}")
            for column, value in encode_row(row).items():
                out.setdefault(column, []).append(value)
        return out

    try:
        return rows.map(
            batch,
            batched=True,
            batch_size=1000,
            with_indices=True,
            remove_columns=rows.column_names,
            new_fingerprint=fingerprint,
            desc=desc,
        )
    except TunelabError:
        raise
    except Exception as e:
        cause = e.__cause__ or e.__context__
        if isinstance(cause, TunelabError):
            raise cause from None
        raise


def fingerprint(identity: list, spec, tokenizer) -> str:
    """The cache key of a source (`identity`, data/read.py) tokenized by `spec` (a DataSpec) and `tokenizer`."""
    key = json.dumps(
        [
            CACHE_VERSION,
            identity,
            asdict(spec),
            tokenizer.name_or_path,
            type(tokenizer).__name__,
            len(tokenizer),
            tokenizer.eos_token,
            effective_chat_template(tokenizer) if spec.format in CONVERSATION_FORMATS else None,
        ],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def as_examples(tokenized, ids: str = "input_ids", targets: str = "targets", truncated: str = "truncated"):
    """The mapped columns `ids`, `targets` and `truncated` as TokenizedData, every sequence an example of its own
    row: read as flat Arrow buffers, not as a Python list per sequence."""
    table = tokenized.data.table if hasattr(tokenized.data, "table") else tokenized.data
    ids_col = table.column(ids).combine_chunks()
    tgt_col = table.column(targets).combine_chunks()
    offsets = ids_col.offsets.to_numpy().astype(np.int64)
    flat_ids = ids_col.values.to_numpy().astype(np.int32)
    flat_targets = tgt_col.values.to_numpy().astype(np.int32)
    cut = np.asarray(table.column(truncated).to_numpy(zero_copy_only=False), dtype=bool)
    offsets = offsets - offsets[0]
    lengths = np.diff(offsets)
    stats = stats_of(lengths, flat_targets, cut, rows=len(lengths), dropped=0)
    return TokenizedData(flat_ids, flat_targets, offsets, stats, np.arange(len(lengths), dtype=np.int64), cut)
