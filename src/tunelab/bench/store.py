"""The local results database: one SQLite table `runs`, one row per measured benchmark point.

A row carries what someone else needs to reproduce the figure (docs/metrics.md): device and its memory, library
versions, model, method, precision, batch shape, packing, checkpointing, the dataset's token statistics,
the measured metrics, plan's predicted ones, `kind` ('tunelab' or a peer's name such as 'hf-trainer', so
peer runs land in the same table) and a UTC timestamp. Records are flat dicts keyed by column name; `data`
and `config` hold JSON objects. Unknown keys are refused: a typo must not silently drop a measurement.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import time
from pathlib import Path

from ..errors import TunelabError
from ..io import check_output_file

# column -> SQLite type. Order is the export order.
COLUMNS: dict[str, str] = {
    "id": "INTEGER PRIMARY KEY AUTOINCREMENT",
    "timestamp": "TEXT NOT NULL",
    "kind": "TEXT NOT NULL",
    "label": "TEXT",  # the sweep point, e.g. "micro_batch=8 seq_len=256"
    "device": "TEXT",
    "device_memory_bytes": "INTEGER",
    "torch_version": "TEXT",
    "transformers_version": "TEXT",
    "peft_version": "TEXT",
    "accelerate_version": "TEXT",
    "model": "TEXT",
    "method": "TEXT",
    "precision": "TEXT",
    "micro_batch": "INTEGER",
    "grad_accum": "INTEGER",
    # Data-parallel processes of the run (micro_batch is per process); rows from before it were single-process.
    "world_size": "INTEGER NOT NULL DEFAULT 1",
    "seq_len": "INTEGER",
    "packing": "BOOLEAN",
    "grad_ckpt": "BOOLEAN",
    "compile": "JSON",  # runtime.compile_choice of the run ({"mode", "chosen", "why"}), or a suite row's boolean
    "warmup_steps": "INTEGER",
    "steps": "INTEGER",  # optimizer steps in the steady-state window
    "data": "JSON",  # dataset token statistics (rows, examples, tokens_nonpad, tokens_loss, ..., packing_efficiency)
    "tokens_padded_per_s": "REAL",
    "tokens_nonpad_per_s": "REAL",
    "tokens_loss_per_s": "REAL",
    "step_time_s": "REAL",  # the median step, as step_time_median_s
    "step_time_median_s": "REAL",
    "step_time_p90_s": "REAL",
    "step_time_max_s": "REAL",
    "steady_window_s": "REAL",  # the window's seconds: tokens_*_per_s are its tokens over these
    "rate_basis": "TEXT",  # what tokens_*_per_s divide by: "window" (the steady-state window's wall time)
    "model_flops_per_token": "REAL",
    "hardware_flops_per_token": "REAL",
    "device_peak_flops": "REAL",
    "peak_source": "TEXT",
    "peak_probes": "JSON",  # matmul probe FLOP/s per dtype measured at run time ({"bf16": ..., "fp32": ...})
    "device_bandwidth_bps": "REAL",  # a CPU's copy probe at run time (read + write bytes/s); NULL on a GPU
    "device_call_s": "REAL",  # a CPU's product-call probe at run time (probe.product_call_s, seconds); NULL on a GPU
    "gpu_copy_bps": "REAL",  # a GPU's copy probe at run time (read + write bytes/s); NULL on a CPU
    "mamf_flops": "REAL",  # a GPU's Maximum Achievable Matmul FLOP/s at run time (probe.mamf); NULL on a CPU
    "mamf_shape": "JSON",  # the (m, n, k) that reached mamf_flops
    "mfu": "REAL",
    "mfu_useful": "REAL",  # mfu with attention counted document-causal (docs/metrics.md)
    "hfu": "REAL",
    "peak_memory_bytes": "INTEGER",
    "peak_memory_reserved_bytes": "INTEGER",
    "peak_memory_absolute_bytes": "INTEGER",
    "predicted_tokens_padded_per_s": "REAL",
    "predicted_tokens_nonpad_per_s": "REAL",
    "predicted_tokens_loss_per_s": "REAL",
    "predicted_step_time_s": "REAL",
    "predicted_peak_memory_bytes": "INTEGER",
    "predicted_efficiency": "REAL",
    "predicted_source": "TEXT",  # where plan's efficiency came from (calibrated or default)
    "config": "JSON",  # the full training config of the point, to re-run it
    "objective": "TEXT",  # the objective row the point trained (NULL in rows from before it: sft, dpo or orpo)
    # A generating objective's own figures (grpo: completions/s, completion lengths, completions per step, ...;
    # bench/grpo_peer.py): its step is counted in completions, not in the token rates above (NULL there).
    "generation": "JSON",
}
# What every tokens_*_per_s of a record divides by: the steady-state window's wall time (synchronized at its
# edges), not the median step; step_time_median_s/p90/max describe the steps themselves.
RATE_BASIS = "window"
JSON_COLUMNS = {k for k, v in COLUMNS.items() if v == "JSON"}
BOOL_COLUMNS = {k for k, v in COLUMNS.items() if v == "BOOLEAN"}


def check(db_path: Path, flag: str = "--db") -> None:
    """Fail before anything is measured when `db_path` cannot take records: a folder is there, a file is where a
    folder above it goes, or the file is not a SQLite database."""
    check_output_file(db_path, flag)
    if db_path.exists():
        _connect(db_path).close()


def _connect(db_path: str | Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db_path, timeout=30)
    cols = ", ".join(f"{k} {v}" for k, v in COLUMNS.items())
    try:
        conn.execute(f"CREATE TABLE IF NOT EXISTS runs ({cols})")
    except sqlite3.OperationalError as e:  # a database of another bench run busy past the timeout, say
        conn.close()
        raise TunelabError(f"{db_path}: {e}; wait for the process using it or pass another --db") from None
    except sqlite3.DatabaseError as e:
        conn.close()
        raise TunelabError(f"{db_path}: not a results database ({e}); pass a bench.sqlite that bench wrote") from None
    have = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    for k, v in COLUMNS.items():  # a database from an older tunelab gains the new columns (NULL in old rows)
        if k not in have:
            conn.execute(f"ALTER TABLE runs ADD COLUMN {k} {v}")
    return conn


def _check_keys(keys) -> None:
    unknown = sorted(set(keys) - set(COLUMNS))
    if unknown:
        raise ValueError(f"not columns of the runs table: {', '.join(unknown)}")


def insert(db_path: str | Path, record: dict) -> int:
    """Store one record (one transaction: a crash leaves the row whole or absent); returns its id.
    `kind` is required; `timestamp` defaults to now (UTC, ISO 8601)."""
    _check_keys(record)
    if not record.get("kind"):
        raise ValueError("a run record needs its kind ('tunelab' or the peer's name)")
    row = {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **record}
    row.pop("id", None)
    values = [json.dumps(v) if k in JSON_COLUMNS and v is not None else v for k, v in row.items()]
    Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    conn = _connect(db_path)
    try:
        with conn:
            cur = conn.execute(f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", values)
        return int(cur.lastrowid)
    finally:
        conn.close()


def query(db_path: str | Path, **filters) -> list[dict]:
    """Rows whose columns equal the given values (e.g. kind='tunelab', method='lora'), oldest first."""
    _check_keys(filters)
    if not Path(db_path).is_file():
        return []
    where = " AND ".join(f"{k} IS ?" for k in filters)
    conn = _connect(db_path)
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute(
            f"SELECT * FROM runs{' WHERE ' + where if where else ''} ORDER BY id", list(filters.values())
        )
        return [_decode(dict(r)) for r in rows]
    finally:
        conn.close()


def read(db_path: str | Path) -> list[dict]:
    """Every row, oldest first, opened read-only: for readers (`tunelab report`) that must not create a table
    in a file they were handed."""
    try:
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        try:
            conn.row_factory = sqlite3.Row
            return [_decode(dict(r)) for r in conn.execute("SELECT * FROM runs ORDER BY id")]
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise TunelabError(f"{db_path}: cannot read table `runs` ({e}); pass a bench.sqlite that bench wrote") from None


def _decode(row: dict) -> dict:
    for k in JSON_COLUMNS:
        if row.get(k) is not None:
            row[k] = json.loads(row[k])
    for k in BOOL_COLUMNS:
        if row.get(k) is not None:
            row[k] = bool(row[k])
    return row


def export(rows: list[dict], fmt: str) -> str:
    """csv (one line per run, JSON columns as JSON text) or json (one JSON array)."""
    if fmt == "json":
        return json.dumps(rows, indent=2) + "\n"
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: json.dumps(v) if k in JSON_COLUMNS and v is not None else v for k, v in r.items()})
    return buf.getvalue()


def mfu_text(rec: dict) -> str:
    """The headline useful MFU with the whole-row figure beside it, e.g. `43.0% (47.1% whole row)`; a record
    from before the useful figure shows the whole-row one alone."""
    if rec.get("mfu") is None:
        return ""
    if rec.get("mfu_useful") is None:
        return f"{rec['mfu']:.1%}"
    return f"{rec['mfu_useful']:.1%} ({rec['mfu']:.1%} whole row)"
