"""The runs browser's reading side: the run directories under `--runs`, each one's status, config, metrics
curves, measured figures and plan's prediction where the run recorded one; bench's results databases there.
Torch-free, and read-only: it never takes a run's lock or writes under `--runs`.

A run's status, from what it leaves in its output_dir:
- running: a live process holds the output_dir's lock (train/lock.py);
- finished: summary.json says `finished` (every step, or early stopping);
- stopped: it ended before its last step and can continue: summary.json without `finished` (a measuring
  run's early stop), or no summary.json and a checkpoint to resume from (Ctrl-C, or SIGINT from the page);
- failed: no summary.json and no checkpoint: it ended before its first checkpoint, or crashed.
An exit status that this server saw (a run it started) wins over the last two guesses: 130 (SIGINT) is
stopped, any other non-zero status failed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .. import figures
from ..bench import store
from ..errors import TunelabError
from ..train.lock import LOCK, held

RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", LOCK)
# How deep under --runs run directories are looked for (runs/<name>, runs/<group>/<name>, ...).
MAX_DEPTH = 3
SIGINT_STATUS = 130
# The measured figures the runs page shows, and plan's name for each where the demo's eval.json recorded it.
MEASURED = ("train_s", "tokens_padded_per_s", "tokens_nonpad_per_s", "peak_memory_bytes")  # figures.py defines each


def inside(root: Path, relative: str) -> Path:
    """`relative` as a path under `root`: no absolute path, no `..`, nothing that resolves (through a symlink)
    outside `root`. The runs browser serves nothing else."""
    if not relative or relative.startswith(("/", "\\")) or any(p in ("..", "") for p in relative.split("/")):
        raise TunelabError(f"{relative!r}: not a path under the runs folder")
    base = root.resolve()
    target = (base / relative).resolve()
    if target != base and base not in target.parents:
        raise TunelabError(f"{relative!r}: leads outside the runs folder")
    return target


def is_run(folder: Path) -> bool:
    return any((folder / name).is_file() for name in RUN_FILES)


def run_names(root: Path) -> list[str]:
    """Run directories under `root`, as paths relative to it; symlinked folders are not followed."""
    found: list[str] = []

    def walk(folder: Path, depth: int) -> None:
        for child in sorted(folder.iterdir()) if folder.is_dir() else ():
            if child.is_symlink() or not child.is_dir() or child.name.startswith("."):
                continue
            if is_run(child):
                found.append(child.relative_to(root).as_posix())
            elif depth < MAX_DEPTH:
                walk(child, depth + 1)

    walk(root, 1)
    return found


def status(folder: Path, exit_status: int | None = None) -> str:
    if held(folder):
        return "running"
    summary = read_json(folder / "summary.json")
    if summary is not None:
        return "finished" if summary.get("finished") else "stopped"
    if exit_status is not None and exit_status != 0:
        return "stopped" if exit_status == SIGINT_STATUS else "failed"
    checkpoints = folder / "checkpoints"
    resumable = checkpoints.is_dir() and any(p.is_dir() for p in checkpoints.iterdir())
    return "stopped" if resumable else "failed"


def read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def metrics(path: Path) -> list[dict]:
    """metrics.jsonl's records; a line being written (no newline yet) or a damaged one is left out."""
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            out.append(_finite(record))
    return out


def _finite(record: dict) -> dict:
    """JSON has no NaN: a diverged loss is shown as missing, not sent as invalid JSON."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}


def summary_row(root: Path, name: str, exit_status: int | None = None) -> dict:
    """What the run list shows of one run: its status and latest step."""
    folder = inside(root, name)
    records = [r for r in metrics(folder / "metrics.jsonl") if "loss" in r]
    last = records[-1] if records else {}
    return {
        "name": name,
        "status": status(folder, exit_status),
        "step": last.get("step"),
        "total_steps": last.get("total_steps"),
        "loss": last.get("loss"),
        "adapter": (folder / "adapter" / "adapter_config.json").is_file(),
    }


def detail(root: Path, name: str, exit_status: int | None = None) -> dict:
    """One run's page: config, status, curves, the latest rates, memory and ETA, the summary's measured figures
    and plan's prediction beside them when the run recorded one (eval.json or plan.json: `comparison`)."""
    folder = inside(root, name)
    if not folder.is_dir() or not is_run(folder):
        raise TunelabError(f"{name}: no run there (no {', '.join(RUN_FILES[:3])})")
    records = metrics(folder / "metrics.jsonl")
    train = [r for r in records if "loss" in r]
    last = train[-1] if train else {}
    summary = read_json(folder / "summary.json")
    recorded = read_json(folder / "eval.json")
    state = status(folder, exit_status)
    try:
        config = (folder / "config.yaml").read_text()
    except OSError:
        config = ""
    return {
        **summary_row(root, name, exit_status),
        "status": state,
        "config": config,
        "loss": [[r["step"], r.get("loss")] for r in train],
        "eval_loss": [[r["step"], r.get("eval_loss")] for r in records if "eval_loss" in r],
        "tokens_nonpad_per_s": last.get("tokens_nonpad_per_s"),
        # The demo's measured peak once it wrote one (the comparison's, below), else the run's latest.
        "peak_memory_bytes": ((recorded or {}).get("train") or {}).get(
            "peak_memory_bytes", last.get("peak_memory_bytes")
        ),
        "eta_s": last.get("eta_s") if state == "running" else None,
        "elapsed_s": last.get("elapsed_s"),
        "summary": summary,
        "comparison": comparison(summary, recorded, read_json(folder / "plan.json")),
    }


def comparison(summary: dict | None, recorded: dict | None, planned: dict | None = None) -> list[dict]:
    """Measured beside predicted: the summary's figures and the prediction the run recorded: eval.json's
    `predicted` (the demo writes it), else plan.json (a `tunelab plan --json` line saved in the run directory,
    which `tunelab report` reads too). One row per figure either side has."""
    predicted = (recorded or {}).get("predicted") or {}
    if not predicted and planned:
        predicted = {**planned, "tokens_padded_per_s": planned.get("tokens_per_s")}
    # eval.json's measured figures first: the ones the demo's closing table showed (its peak is counted from before
    # any model loaded, as plan counts it; summary.json's from the run's start, after the base model's scoring).
    measured = {**(summary or {}), **((recorded or {}).get("train") or {})}
    rows = []
    for key in MEASURED:
        if measured.get(key) is not None or predicted.get(key) is not None:
            rows.append(figures.row(key, measured.get(key), predicted.get(key)))
    return rows


def bench_databases(root: Path) -> list[str]:
    """bench's results databases (`*.sqlite`) under `root`, as relative paths; none that a symlink leads out to."""
    out = []
    for path in sorted(root.rglob("*.sqlite")) if root.is_dir() else ():
        name = path.relative_to(root).as_posix()
        try:
            inside(root, name)
        except TunelabError:  # through a symlink that leads out
            continue
        out.append(name)
    return out


BENCH_COLUMNS = (
    "id",
    "timestamp",
    "kind",
    "label",
    "device",
    "model",
    "method",
    "micro_batch",
    "seq_len",
    "tokens_nonpad_per_s",
    "mfu",
    "mfu_useful",
    "peak_memory_bytes",
    "predicted_tokens_nonpad_per_s",
)


def bench_rows(root: Path, name: str) -> list[dict]:
    """A results database's points (store.read: read-only), with the columns the page's table shows."""
    path = inside(root, name)
    if path.suffix != ".sqlite" or not path.is_file():
        raise TunelabError(f"{name}: not a results database under the runs folder")
    return [{k: _finite({k: row.get(k)})[k] for k in BENCH_COLUMNS} for row in store.read(path)]
