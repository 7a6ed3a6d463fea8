"""Source rows: a data file (.jsonl, .json, .csv, .parquet) or a hub dataset (`hf://owner/name:split`) as a
`datasets.Dataset` (memory-mapped Arrow, cached), with what identifies its content for the tokenization cache.

Every way a source can be unreadable is one line naming the file and, where there is one, the line: JSONL and
text files are checked line by line here before `datasets` reads them, since `datasets` reports neither.
"""

from __future__ import annotations

import codecs
import json
import logging
from pathlib import Path
from typing import Any, NamedTuple

from .. import hub
from ..errors import TunelabError
from .formats import REQUIRED_FIELDS, check_fields

# A JSONL line longer than this is refused rather than read: bytes per token rarely exceed 4-5 in any
# tokenizer, so a line over 64 bytes per seq_len token (and over 1 MiB, so long-context rows always pass) is
# nearly all cut away by truncation, and is more likely a whole file on one line than a training example.
BYTES_PER_TOKEN_LIMIT = 64
MIN_LINE_LIMIT = 2**20
READERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
# Text files are read as UTF-8 with an optional byte-order mark, which Windows editors (Notepad) write.
TEXT_ENCODING = "utf-8-sig"


class Source(NamedTuple):
    rows: Any  # a datasets.Dataset
    label: str  # the name errors give it
    identity: list  # what identifies its content for the cache


def read_source(path: str, fmt: str, max_examples: int | None, seq_len: int, key: str = "data.path") -> Source:
    """The rows of a file or hub dataset `path` in format `fmt` (a JSONL file's lines and a hub dataset's columns
    checked against it here, other files' rows as they are tokenized); `key` is the setting that names it.

    The identity is a file's path, size and mtime, or a hub dataset's repo, subset, split and fingerprint (which
    changes with its revision).
    """
    if hub.is_hub_data(path):
        return read_hub_rows(hub.parse_data(path), fmt, max_examples)
    file = Path(path)
    rows = read_rows(file, fmt, max_examples, line_limit(seq_len), key)
    stat = file.stat()
    return Source(rows, str(file), [str(file.resolve()), stat.st_size, stat.st_mtime_ns])


def read_hub_rows(ref: hub.HubData, fmt: str, max_examples: int | None) -> Source:
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
    return Source(ds, ref.uri, identity)


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
