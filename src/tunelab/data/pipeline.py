"""Data settings -> tokenized examples with loss targets, plus the statistics of what the data became: one source
of supervised rows (read: data/read.py, tokenized: data/tokenize.py) or of preference pairs (data/pairs.py),
a mixture (`data.mix`, each source prepared so, then its examples drawn by weight), and a held-out split.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import objectives
from ..errors import TunelabError
from .examples import TokenizedData, concat, loss_tokens, select
from .formats import render
from .read import read_source
from .tokenize import as_examples, bos_ids, encode, fingerprint, tokenize_rows

ROWS = "data.pipeline:prepare_rows"


@dataclass(frozen=True)
class MixPart:
    """One source of a mixture, with the format and template its rows are rendered by."""

    path: str
    weight: float
    format: str
    template: str


@dataclass(frozen=True)
class DataSpec:
    """A file or hub dataset (`path`), or a mixture (`mix`, with `max_examples` its total and `seed` its draw)."""

    path: str | None
    format: str
    template: str
    train_on_inputs: bool
    seq_len: int
    max_examples: int | None = None
    mix: tuple[MixPart, ...] = ()
    seed: int = 42
    key: str = "data.path"  # the config key that names `path`, for errors
    # What builds the examples: the objective's data builder (objectives.Objective.data_builder), `module:function`.
    builder: str = ROWS
    # Tokens of seq_len left free after each prompt for what the model writes (prompt rows: data/prompts.py).
    reserve: int = 0


def prepare(spec: DataSpec, tokenizer) -> TokenizedData:
    """Tokenized examples from `spec`, by the builder the objective names: supervised rows (prepare_rows) or
    preference pairs (data/pairs.py)."""
    return objectives.load(spec.builder)(spec, tokenizer)


def prepare_rows(spec: DataSpec, tokenizer) -> TokenizedData:
    """Read, render, tokenize (cached), truncate and mask one dataset, or draw a mixture of several."""
    if spec.mix:
        parts = [prepare(part_spec(spec, i), tokenizer) for i in range(len(spec.mix))]
        return mix(parts, spec.mix, spec.max_examples, spec.seed)
    source = read_source(spec.path, spec.format, spec.max_examples, spec.seq_len, spec.key)
    eos, bos = tokenizer.eos_token or "", bos_ids(tokenizer)

    def encode_row(row):
        segments = render(spec.format, spec.template, row, eos, tokenizer)
        ids, targets, cut = encode(segments, tokenizer, bos, spec.seq_len, spec.train_on_inputs)
        return {"input_ids": ids, "targets": targets, "truncated": cut}

    key = fingerprint(source.identity, spec, tokenizer)
    data = as_examples(tokenize_rows(source.rows, spec.format, source.label, encode_row, key, "tokenizing"))
    keep = loss_tokens(data) > 0
    if not keep.any():
        raise TunelabError(
            f"{source.label}: no example has a token to learn from after masking and truncation; "
            "raise seq_len, or set data.train_on_inputs: true"
        )
    if keep.all():
        return data
    return select(data, np.flatnonzero(keep), rows=len(data), dropped=int((~keep).sum()))


def part_spec(spec: DataSpec, index: int) -> DataSpec:
    """Mixture source `index` as a dataset of its own: read whole (the mixture's total is drawn afterwards)."""
    part = spec.mix[index]
    return replace(
        spec,
        path=part.path,
        format=part.format,
        template=part.template,
        max_examples=None,
        mix=(),
        key=f"data.mix[{index}].path",
    )


# Second word of the mixture's random streams (the third is the source's index): no draw is shared with the
# split (SPLIT_STREAM) or batch order ([seed, epoch]).
MIX_STREAM = 0x6D6978


def mix_counts(sizes: list[int], weights: list[float], total: int | None) -> list[int]:
    """Examples each source contributes: round(weight / sum of weights x total); total defaults to all sources'."""
    total = sum(sizes) if total is None else total
    scale = sum(weights)
    return [round(w / scale * total) for w in weights]


def mix(parts: list[TokenizedData], sources: tuple[MixPart, ...], total: int | None, seed: int) -> TokenizedData:
    """The mixture: from each source its count of examples, drawn by `seed` without replacement; a source with
    fewer examples than its count gives each of them count // size times and a seeded draw of the remainder."""
    counts = mix_counts([len(p) for p in parts], [s.weight for s in sources], total)
    chosen = []
    for i, (data, source, count) in enumerate(zip(parts, sources, counts)):
        if count < 1:
            raise TunelabError(
                f"data.mix: {source.path} gets 0 examples at weight {source.weight:g} of {sum(counts)}; "
                "raise its weight or drop it"
            )
        rng = np.random.default_rng([seed, MIX_STREAM, i])
        size = len(data)
        repeats, rest = divmod(count, size)
        index = np.concatenate([np.tile(np.arange(size), repeats), np.sort(rng.permutation(size)[:rest])])
        chosen.append(select(data, index, rows=data.stats.rows, dropped=data.stats.dropped))
    return concat(chosen)


@dataclass(frozen=True)
class HeldOutSpec:
    """Evaluation data: a fraction of the training file's examples, chosen by `seed`, or a file of its own."""

    fraction: float | None = None
    path: str | None = None
    max_rows: int | None = None  # evaluate at most this many examples
    seed: int = 42


# Second word of the split's random stream: batch order uses [seed, epoch], so the split never shares its draws.
SPLIT_STREAM = 0x6576616C


def prepare_split(spec: DataSpec, held: HeldOutSpec | None, tokenizer) -> tuple[TokenizedData, TokenizedData | None]:
    """(training examples, evaluation examples or None): both formatted, masked and truncated by `spec`."""
    if held is not None and held.path is None and spec.mix:
        return _split_mix(spec, held, tokenizer)
    data = prepare(spec, tokenizer)
    if held is None:
        return data, None
    if held.path is not None:
        return data, prepare(eval_file_spec(spec, held.path, held.max_rows), tokenizer)
    train, evaluation = hold_out(data, held.fraction, held.seed, spec.path)
    if held.max_rows is not None and held.max_rows < len(evaluation):
        evaluation = select(evaluation, np.arange(held.max_rows), rows=held.max_rows)
    return train, evaluation


def eval_file_spec(spec: DataSpec, path: str, max_rows: int | None) -> DataSpec:
    """The evaluation file (eval.path) read as the training data is: same format, template and seq_len."""
    return replace(spec, path=path, max_examples=max_rows, mix=(), key="eval.path")


def _split_mix(spec: DataSpec, held: HeldOutSpec, tokenizer) -> tuple[TokenizedData, TokenizedData]:
    """A mixture's split: each source holds out its fraction before the draw, so that an example a small
    source repeats is never on both sides; the evaluation examples are every source's held-out ones."""
    sides = [
        hold_out(prepare(part_spec(spec, i), tokenizer), held.fraction, held.seed, p.path)
        for i, p in enumerate(spec.mix)
    ]
    train = mix([t for t, _ in sides], spec.mix, spec.max_examples, spec.seed)
    evaluation = concat([e for _, e in sides])
    if held.max_rows is not None and held.max_rows < len(evaluation):
        # A seeded sample, not the first rows, which would all come from the first source.
        pick = np.random.default_rng([held.seed, SPLIT_STREAM]).permutation(len(evaluation))[: held.max_rows]
        evaluation = select(evaluation, np.sort(pick), rows=held.max_rows)
    return train, evaluation


def hold_out(
    data: TokenizedData, fraction: float, seed: int, path: str = "data"
) -> tuple[TokenizedData, TokenizedData]:
    """Split examples into (train, held out): round(fraction x examples) held out, drawn by `seed`, disjoint.

    Rows dropped by masking and truncation belong to neither; they stay counted on the training side, so the
    two sides' rows add up to the file's.
    """
    n = len(data)
    k = round(fraction * n)
    if k < 1 or k >= n:
        raise TunelabError(
            f"{path}: eval.split {fraction} of {n} examples holds out {k}; "
            "both sides need at least one example (raise eval.split or add rows)"
        )
    order = np.random.default_rng([seed, SPLIT_STREAM]).permutation(n)
    held = np.sort(order[:k])
    train = np.sort(order[k:])
    st = data.stats
    return select(data, train, rows=st.rows - k, dropped=st.dropped), select(data, held, rows=k)
