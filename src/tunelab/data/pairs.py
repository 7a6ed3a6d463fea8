"""Preference pairs -> tokenized examples: each row {prompt, chosen, rejected} becomes two examples, the chosen
sequence at index 2i and the rejected one at 2i + 1, each its prompt then its response, read, tokenized and
shifted as supervised rows are (data/read.py, data/tokenize.py). Packing keeps a pair's two sequences together,
as two documents of one row (data/packing.py, `group`).

A pair must fit one packed row, so each side is cut to seq_len // 2 tokens; a pair whose cut leaves either
response without a token is dropped (counted, as supervised rows are), and none left is an error.
"""

from __future__ import annotations

import numpy as np

from ..errors import TunelabError
from .examples import TokenizedData, concat, loss_tokens, select
from .formats import render_pair_side
from .read import read_source
from .tokenize import as_examples, bos_ids, encode, fingerprint, tokenize_rows

FORMAT = "preference"
SIDES = ("chosen", "rejected")


def prepare_pairs(spec, tokenizer) -> TokenizedData:
    """Read, check, render, tokenize (cached by datasets, as supervised rows are) and cut one source of pairs;
    `spec` is the DataSpec (data/pipeline.py) whose `format` renders each side."""
    source = read_source(spec.path, FORMAT, spec.max_examples, spec.seq_len, spec.key)
    eos, bos = tokenizer.eos_token or "", bos_ids(tokenizer)
    side_len = spec.seq_len // 2

    def encode_row(row):
        out = {}
        for side in SIDES:
            segments = render_pair_side(spec.format, spec.template, row, side, eos, tokenizer)
            ids, targets, cut = encode(segments, tokenizer, bos, side_len)
            out |= {f"{side}_ids": ids, f"{side}_targets": targets, f"{side}_truncated": cut}
        return out

    key = fingerprint([FORMAT, source.identity], spec, tokenizer)
    return interleave(
        tokenize_rows(source.rows, FORMAT, source.label, encode_row, key, "tokenizing pairs"), source.label
    )


def interleave(tokenized, label: str) -> TokenizedData:
    """The pairs as examples 2i (chosen) and 2i + 1 (rejected); pairs with an emptied response dropped."""
    chosen, rejected = (as_examples(tokenized, f"{s}_ids", f"{s}_targets", f"{s}_truncated") for s in SIDES)
    keep = (loss_tokens(chosen) > 0) & (loss_tokens(rejected) > 0)
    if not keep.any():
        raise TunelabError(
            f"{label}: no pair keeps a response token after cutting each side to seq_len // 2; raise seq_len"
        )
    kept = np.flatnonzero(keep)
    # Both sides one after another (pair i's rejected side is example pairs + i), then each kept pair's two.
    order = np.stack([kept, kept + len(chosen)], axis=1).ravel()
    return select(concat([chosen, rejected]), order, rows=len(chosen), dropped=int((~keep).sum()))
