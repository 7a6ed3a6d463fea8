"""Rows on disk or on the hub -> tokenized examples with loss targets, plus the statistics of what the data became.

Files and hub datasets (`hf://owner/name:split`) are read through `datasets` (memory-mapped Arrow, cached).
Tokenization is cached too, keyed by the source's identity (a file's path, size and mtime; a hub dataset's repo,
subset, split and fingerprint, which changes with its revision), the tokenizer, the format/template, masking
and seq_len, so a second run (or `plan` after `train`) re-tokenizes nothing. A mixture (`data.mix`) prepares
each source so, then draws its examples from them by weight.

Each example stores `input_ids` and `targets`, where targets are already shifted: `targets[t]` is the token
the model must predict at position t (`input_ids[t+1]` when that token is trainable), else -100. Shifting
per example, before packing, is what keeps a packed row from asking the last token of one sequence to
predict the first token of the next.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from .. import hub
from ..errors import TunelabError
from .formats import CONVERSATION_FORMATS, REQUIRED_FIELDS, check_fields, effective_chat_template, render

IGNORE = -100
# A JSONL line longer than this is refused rather than read: bytes per token rarely exceed 4-5 in any
# tokenizer, so a line over 64 bytes per seq_len token (and over 1 MiB, so long-context rows always pass) is
# nearly all cut away by truncation, and is more likely a whole file on one line than a training example.
BYTES_PER_TOKEN_LIMIT = 64
MIN_LINE_LIMIT = 2**20
READERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
# Text files are read as UTF-8 with an optional byte-order mark, which Windows editors (Notepad) write.
TEXT_ENCODING = "utf-8-sig"
# Bump when tokenization output changes, so old caches are not reused.
CACHE_VERSION = "1"


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
    pairs: bool = False  # rows are preference pairs (data/preference.py)


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


def prepare(spec: DataSpec, tokenizer) -> TokenizedData:
    """Read, render, tokenize (cached), truncate and mask one dataset, or draw a mixture of several."""
    if spec.pairs:
        from .preference import prepare_pairs  # it builds on this module

        return prepare_pairs(spec, tokenizer)
    if spec.mix:
        parts = [prepare(part_spec(spec, i), tokenizer) for i in range(len(spec.mix))]
        return mix(parts, spec.mix, spec.max_examples, spec.seed)
    rows, label, identity = read_source(spec)
    eos = tokenizer.eos_token or ""
    bos = (
        [tokenizer.bos_token_id]
        if getattr(tokenizer, "add_bos_token", False) and tokenizer.bos_token_id is not None
        else []
    )

    def tokenize(batch, indices):
        out_ids, out_targets, out_truncated = [], [], []
        keys = list(batch.keys())
        for n, index in enumerate(indices):
            row = {k: batch[k][n] for k in keys}
            where = f"{label}: row {index + 1}"
            check_fields(spec.format, row, where)
            segments = render(spec.format, spec.template, row, eos, tokenizer)
            texts = [s.text for s in segments]
            pieces = tokenizer(texts, add_special_tokens=False)["input_ids"]
            ids, trainable = list(bos), [spec.train_on_inputs] * len(bos)
            for seg, piece in zip(segments, pieces):
                ids.extend(piece)
                trainable.extend([seg.trainable or spec.train_on_inputs] * len(piece))
            out_truncated.append(len(ids) > spec.seq_len)
            ids, trainable = ids[: spec.seq_len], trainable[: spec.seq_len]
            targets = [ids[t + 1] if trainable[t + 1] else IGNORE for t in range(len(ids) - 1)] + [IGNORE]
            out_ids.append(ids)
            out_targets.append(targets)
        return {"input_ids": out_ids, "targets": out_targets, "truncated": out_truncated}

    tokenized = map_rows(rows, tokenize, _fingerprint(identity, spec, tokenizer), "tokenizing")
    return _to_arrays(tokenized, label)


def map_rows(rows, tokenize, fingerprint: str, desc: str):
    """`rows.map(tokenize)` in batches, cached under `fingerprint`; a TunelabError raised inside surfaces as itself
    (datasets wraps errors raised inside map)."""
    try:
        return rows.map(
            tokenize,
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


def read_source(spec: DataSpec) -> tuple:
    """(rows as a `datasets.Dataset`, the name errors give it, what identifies its content for the cache)."""
    if hub.is_hub_data(spec.path):
        return read_hub_rows(hub.parse_data(spec.path), spec.format, spec.max_examples)
    path = Path(spec.path)
    rows = read_rows(path, spec.format, spec.max_examples, line_limit(spec.seq_len), spec.key)
    stat = path.stat()
    return rows, str(path), [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def read_hub_rows(ref: hub.HubData, fmt: str, max_examples: int | None) -> tuple:
    """A hub dataset's split, its columns checked against `fmt` before any row is rendered."""
    ds = hub.load_data(ref)
    if len(ds) == 0:
        raise TunelabError(f"{ref.uri}: the split is empty")
    missing = [f for f in REQUIRED_FIELDS[fmt] if f not in ds.column_names]
    if missing:
        raise TunelabError(
            f"{ref.uri}: no column {', '.join(repr(m) for m in missing)} for format {fmt!r} (it needs "
            f"{', '.join(REQUIRED_FIELDS[fmt])}; the dataset has {', '.join(ds.column_names)}); set data.format "
            "to match, or rename the columns in a local copy"
        )
    # The datasets fingerprint of a hub split hashes its cache folder, which names the revision's commit.
    identity = ["hf", ref.repo, ref.subset, ref.split, ds._fingerprint]
    if max_examples is not None and max_examples < len(ds):
        ds = ds.select(range(max_examples))
    return ds, ref.uri, identity


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


def concat(parts: list[TokenizedData]) -> TokenizedData:
    """Examples of several datasets one after another; rows and dropped add up."""
    lengths = np.concatenate([p.lengths for p in parts])
    targets = np.concatenate([p.targets for p in parts])
    truncated = np.concatenate([p.truncated for p in parts])
    stats = _stats(lengths, targets, truncated, sum(p.stats.rows for p in parts), sum(p.stats.dropped for p in parts))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = np.concatenate([p.ids for p in parts])
    return TokenizedData(ids, targets, offsets, stats, np.concatenate([p.rows for p in parts]), truncated)


def line_limit(seq_len: int) -> int:
    """The longest JSONL line, in bytes, read for rows of `seq_len` tokens (BYTES_PER_TOKEN_LIMIT)."""
    return max(MIN_LINE_LIMIT, BYTES_PER_TOKEN_LIMIT * seq_len)


def read_rows(
    path: Path, fmt: str, max_examples: int | None, max_line_bytes: int | None = None, key: str = "data.path"
):
    """Load a data file as a `datasets.Dataset`, failing with the file and line for malformed input; `key` is
    the setting that names the file."""
    import datasets

    datasets.disable_progress_bars()
    if path.is_dir():
        raise TunelabError(f"{path}: is a directory; set {key} to a data file in it (.jsonl, .json, .csv, .parquet)")
    if not path.is_file():
        raise TunelabError(f"{path}: data file not found (set {key})")
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise TunelabError(f"{path}: unknown file type {path.suffix!r}; use .jsonl, .json, .csv or .parquet")
    if path.suffix.lower() == ".jsonl":
        _check_jsonl(path, fmt, max_line_bytes)
    elif reader != "parquet":
        _check_utf8(path)
    # datasets logs a failed read at ERROR level before raising; the one-line error below says it instead.
    datasets_logger = logging.getLogger("datasets")
    level = datasets_logger.level
    datasets_logger.setLevel(logging.CRITICAL)
    try:
        text = {} if reader == "parquet" else {"encoding": TEXT_ENCODING}
        ds = datasets.load_dataset(reader, data_files=str(path), split="train", **text)
    except Exception as e:
        raise TunelabError(f"{path}: cannot be read as {reader}: {_root_cause(e)}; fix or convert the file") from None
    finally:
        datasets_logger.setLevel(level)
    if len(ds) == 0:
        raise TunelabError(f"{path}: the dataset is empty")
    if max_examples is not None and max_examples < len(ds):
        ds = ds.select(range(max_examples))
    return ds


def _root_cause(e: BaseException) -> str:
    """The first line of the innermost error: `datasets` wraps the parser's own message in a generic one."""
    while (e.__cause__ or e.__context__) is not None:
        e = e.__cause__ or e.__context__
    return (str(e).strip().splitlines() or [type(e).__name__])[0].rstrip(".")


def iter_jsonl(path: Path, fmt: str, max_line_bytes: int | None = None):
    """(line number, row) for each non-blank line, checked: valid UTF-8 JSON, an object, with `fmt`'s fields.

    Reading the lines ourselves is what lets a bad line be reported by its number; `datasets` cannot. A line
    over `max_line_bytes` fails without being read whole.
    """
    with path.open("rb") as f:
        number = 0
        while line := f.readline(-1 if max_line_bytes is None else max_line_bytes + 1):
            number += 1
            if max_line_bytes is not None and len(line) > max_line_bytes and not line.endswith(b"\n"):
                raise TunelabError(
                    f"{path}:{number}: line is over {max_line_bytes:,} bytes, far more than seq_len tokens can "
                    "hold; split it into shorter rows or remove it"
                )
            if not line.strip():
                continue
            text = _decode(line, path, number).rstrip("\r\n")
            try:
                row = json.loads(text)
            except json.JSONDecodeError as e:
                raise TunelabError(
                    f"{path}:{number}: not valid JSON ({_json_problem(e)}); fix or remove the line"
                ) from None
            if not isinstance(row, dict):
                raise TunelabError(f"{path}:{number}: each line must be a JSON object")
            check_fields(fmt, row, f"{path}:{number}")
            yield number, row


def _json_problem(e: json.JSONDecodeError) -> str:
    """json's message placed by column within the one line parsed, not by json's own line and char counts."""
    where = "the end of the line" if not e.doc[e.pos :].strip() else f"column {e.pos + 1}"
    # Messages such as "Invalid control character at" already end in the word that introduces the place.
    return f"{e.msg} {where}" if e.msg.endswith(" at") else f"{e.msg} at {where}"


def _decode(line: bytes, path: Path, number: int) -> str:
    """Line `number` of a text file as text; the first line may start with a byte-order mark, which is dropped."""
    if number == 1 and line.startswith(codecs.BOM_UTF8):
        # Dropped here rather than by the utf-8-sig codec, which would place a bad byte after it one byte early.
        line = line[len(codecs.BOM_UTF8) :]
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TunelabError(
            f"{path}:{number}: not UTF-8 (byte 0x{line[e.start]:02x} at column {e.start + 1}); save the file as UTF-8"
        ) from None


def _check_utf8(path: Path) -> None:
    """A text file's first undecodable byte by line: `datasets` reports it without one (or not at all)."""
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            _decode(line, path, number)


def _check_jsonl(path: Path, fmt: str, max_line_bytes: int | None) -> None:
    if sum(1 for _ in iter_jsonl(path, fmt, max_line_bytes)) == 0:  # every line is read, so every bad one is found
        raise TunelabError(f"{path}: the dataset is empty")


def _fingerprint(identity: list, spec: DataSpec, tokenizer) -> str:
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


def _to_arrays(tokenized, label: str) -> TokenizedData:
    table = tokenized.data.table if hasattr(tokenized.data, "table") else tokenized.data
    ids_col = table.column("input_ids").combine_chunks()
    tgt_col = table.column("targets").combine_chunks()
    offsets = ids_col.offsets.to_numpy().astype(np.int64)
    ids = ids_col.values.to_numpy().astype(np.int32)
    targets = tgt_col.values.to_numpy().astype(np.int32)
    truncated = np.asarray(table.column("truncated").to_numpy(zero_copy_only=False), dtype=bool)
    offsets = offsets - offsets[0]
    lengths = np.diff(offsets)
    counted = np.concatenate([[0], np.cumsum(targets != IGNORE)])
    loss_per = counted[offsets[1:]] - counted[offsets[:-1]]
    keep = loss_per > 0
    rows = len(lengths)
    if not keep.any():
        raise TunelabError(
            f"{label}: no example has a token to learn from after masking and truncation; "
            "raise seq_len, or set data.train_on_inputs: true"
        )
    if not keep.all():
        starts, ends = offsets[:-1][keep], offsets[1:][keep]
        index = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)])
        ids, targets = ids[index], targets[index]
        lengths = lengths[keep]
        offsets = np.concatenate([[0], np.cumsum(lengths)])
    stats = DatasetStats(
        rows=rows,
        examples=int(keep.sum()),
        truncated=int(truncated[keep].sum()),
        dropped=int((~keep).sum()),
        tokens_nonpad=int(lengths.sum()),
        tokens_loss=int(loss_per[keep].sum()),
        max_len=int(lengths.max()),
        mean_len=float(lengths.mean()),
    )
    return TokenizedData(ids, targets, offsets, stats, np.flatnonzero(keep).astype(np.int64), truncated[keep])


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


def select(data: TokenizedData, index: np.ndarray, rows: int, dropped: int = 0) -> TokenizedData:
    """The examples at `index` (in that order), with their statistics; `rows` and `dropped` as the caller counts."""
    starts, ends = data.offsets[:-1][index], data.offsets[1:][index]
    lengths = ends - starts
    flat = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)]) if len(index) else np.zeros(0, np.int64)
    ids, targets = data.ids[flat], data.targets[flat]
    truncated = data.truncated[index]
    stats = _stats(lengths, targets, truncated, rows, dropped)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return TokenizedData(ids, targets, offsets, stats, data.rows[index], truncated)


def _stats(lengths: np.ndarray, targets: np.ndarray, truncated: np.ndarray, rows: int, dropped: int) -> DatasetStats:
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
