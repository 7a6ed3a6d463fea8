"""Stored runs -> performance.md with PNG plots (`tunelab report RUN_OR_DB... --out DIR`, commands/report.py).

Inputs are run directories (`summary.json`, `metrics.jsonl`, optionally `config.yaml`, `eval.json` and a
plan prediction in `plan.json`) and SQLite result databases (table `runs`, one row per record, `kind` =
'tunelab' or a peer name). Every number in the report is read from those inputs; a figure or table whose
inputs are missing is left out, never filled in. Files are written under temporary names and renamed into
place, performance.md last, so a reader never sees a report that points at a missing or half-written plot.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .. import objectives
from ..bench import store
from ..bench.compare import compare
from ..errors import TunelabError
from ..io import move_files
from ..markdown import gib_cell, num, table
from . import plots

SQLITE_MAGIC = b"SQLite format 3\x00"
# Config keys a sweep varies; records that agree on all but one of them form a sweep over that one.
SWEEP_KEYS = (
    "model",
    "method",
    "precision",
    "seq_len",
    "micro_batch",
    "grad_accum",
    "packing",
    "grad_ckpt",
    "lora_r",
    "base_quant",
)
# A DB column holding a whole record as JSON is merged into the row (whatever the store names it).


@dataclass(frozen=True)
class Prediction:
    """Plan's figures for a run: from a plan record (`plan.json` or `predicted`) or bench's predicted_* columns."""

    step_time_s: float
    tokens_nonpad_per_s: float | None
    peak_memory_bytes: float | None
    memory_breakdown: dict[str, float] | None

    @staticmethod
    def of(record: dict[str, Any]) -> Prediction | None:
        plan = record.get("predicted")
        if isinstance(plan, dict) and plan.get("train_s") and plan.get("optimizer_steps"):
            return Prediction(
                plan["train_s"] / plan["optimizer_steps"],
                plan.get("tokens_nonpad_per_s"),
                plan.get("peak_memory_bytes"),
                plan.get("memory_breakdown"),
            )
        if record.get("predicted_step_time_s"):
            return Prediction(
                record["predicted_step_time_s"],
                record.get("predicted_tokens_nonpad_per_s"),
                record.get("predicted_peak_memory_bytes"),
                None,
            )
        return None


@dataclass
class StoredRun:
    """One record (a train/bench summary or a peer's) with what came with it."""

    label: str
    source: str  # the input path it came from (a run dir or a database)
    record: dict[str, Any]
    metrics: list[dict] = field(default_factory=list)  # metrics.jsonl rows, run dirs only
    config: dict[str, Any] | None = None  # config.yaml, run dirs only
    evaluation: dict[str, Any] | None = None  # eval.json

    @property
    def kind(self) -> str:
        return str(self.record.get("kind") or "tunelab")

    @property
    def versions(self) -> dict[str, str]:
        """A train summary's `versions` dict, or the database's `<lib>_version` columns."""
        found = dict(self.record.get("versions") or {})
        found.update({k[: -len("_version")]: v for k, v in self.record.items() if k.endswith("_version") and v})
        return found

    def prediction(self) -> Prediction | None:
        return Prediction.of(self.record)

    def setting(self, key: str) -> Any:
        if key == "lora_r":
            lora = self.record.get("lora") or (self.config or {}).get("lora") or {}
            return self.record.get("lora_r", lora.get("r") if isinstance(lora, dict) else None)
        return self.record.get(key, (self.config or {}).get(key))


# ---------------------------------------------------------------- inputs


def load_inputs(paths: list[Path]) -> list[StoredRun]:
    runs: list[StoredRun] = []
    for path in paths:
        if path.is_dir():
            runs.append(load_run_dir(path))
        elif path.is_file() and _is_sqlite(path):
            runs.extend(load_db(path))
        elif path.exists():
            raise TunelabError(f"{path}: neither a run directory nor a SQLite database")
        else:
            raise TunelabError(f"{path}: not found")
    if not runs:
        raise TunelabError("no runs in the inputs; give run directories or a database that has rows")
    _unique_labels(runs)
    return runs


def _is_sqlite(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TunelabError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


def load_run_dir(path: Path) -> StoredRun:
    summary = path / "summary.json"
    if not summary.is_file():
        raise TunelabError(f"{path}: no summary.json; is this a `tunelab train` output directory?")
    record = _read_json(summary)
    metrics = []
    if (path / "metrics.jsonl").is_file():
        for number, line in enumerate((path / "metrics.jsonl").read_text().splitlines(), 1):
            if line.strip():
                try:
                    metrics.append(json.loads(line))
                except json.JSONDecodeError:
                    raise TunelabError(f"{path / 'metrics.jsonl'}:{number}: not valid JSON") from None
    config = yaml.safe_load((path / "config.yaml").read_text()) if (path / "config.yaml").is_file() else None
    evaluation = _read_json(path / "eval.json") if (path / "eval.json").is_file() else None
    if "predicted" not in record and (path / "plan.json").is_file():
        record["predicted"] = _read_json(path / "plan.json")
    return StoredRun(path.name, str(path), record, metrics, config, evaluation)


def load_db(path: Path) -> list[StoredRun]:
    """Rows of bench's `runs` table as records (bench/store.py owns the layout and its decoding)."""
    runs = []
    for index, record in enumerate(store.read(path), 1):
        ident = record.get("id", index)
        label = f"{record.get('kind') or 'tunelab'} #{ident}" + (f" {record['label']}" if record.get("label") else "")
        config = record.get("config") if isinstance(record.get("config"), dict) else None
        runs.append(
            StoredRun(
                label,
                str(path),
                record,
                config=config,
                evaluation=record.get("eval") if isinstance(record.get("eval"), dict) else None,
            )
        )
    return runs


def _unique_labels(runs: list[StoredRun]) -> None:
    seen: dict[str, int] = {}
    for r in runs:
        seen[r.label] = seen.get(r.label, 0) + 1
        if seen[r.label] > 1:
            r.label = f"{r.label} ({seen[r.label]})"


# ---------------------------------------------------------------- formatting


def _has_rates(r: StoredRun) -> bool:
    return all(isinstance(r.record.get(f"{k}_per_s"), (int, float)) for k, _ in plots.TOKEN_KINDS)


# ---------------------------------------------------------------- sections


def _environment(runs: list[StoredRun]) -> list[str]:
    lines = ["## Environment", ""]
    devices = dict.fromkeys((r.record.get("device"), r.record.get("device_memory_bytes")) for r in runs)
    for name, memory in devices:
        lines.append(f"- device: {name or 'not recorded'}" + (f", {gib_cell(memory)} memory" if memory else ""))
    stacks = dict.fromkeys(json.dumps(r.versions, sort_keys=True) for r in runs)
    for stack in stacks:
        versions = json.loads(stack)
        lines.append("- versions: " + (", ".join(f"{k} {v}" for k, v in versions.items()) or "not recorded"))
    lines.append("")
    return lines


def _steps(rec: dict) -> str:
    """Optimizer steps run, and in brackets those the rates were measured over: a train summary's `steps` are
    all it ran; a bench record's are its measured window, after `warmup_steps`."""
    if "steady_window_steps" in rec:
        return f"{num(rec.get('steps'))} ({num(rec['steady_window_steps'])})"
    if "warmup_steps" in rec and rec.get("steps") is not None:
        return f"{num(rec['warmup_steps'] + rec['steps'])} ({num(rec['steps'])})"
    return num(rec.get("steps"))


def _runs_table(runs: list[StoredRun]) -> list[str]:
    header = [
        "run",
        "kind",
        "precision",
        "seq_len",
        "micro x accum",
        "packing",
        "steps (in window)",
        "non-pad tok/s",
        "padded tok/s",
        "loss tok/s",
        "step time (s)",
        "peak memory",
        "mfu useful (whole row)",
        "loss first -> last",
    ]
    rows = []
    for r in runs:
        rec = r.record
        mfu = rec.get("mfu")
        rows.append(
            [
                r.label,
                r.kind,
                num(rec.get("precision")),
                num(rec.get("seq_len")),
                f"{num(rec.get('micro_batch'))} x {num(rec.get('grad_accum'))}",
                num(rec.get("packing")),
                _steps(rec),
                num(rec.get("tokens_nonpad_per_s")),
                num(rec.get("tokens_padded_per_s")),
                num(rec.get("tokens_loss_per_s")),
                num(rec.get("step_time_s"), 3),
                gib_cell(rec.get("peak_memory_bytes")),
                "n/a" if mfu is None else store.mfu_text(rec),
                f"{num(rec.get('loss_first'), 3)} -> {num(rec.get('loss_last'), 3)}",
            ]
        )
    return [
        "## Runs",
        "",
        "Throughput over the steady-state window (optimizer steps after the warm-up steps, docs/metrics.md): "
        "padded counts every position fed, non-padding only real tokens, loss only tokens with a target.",
        "",
        *table(header, rows),
        "",
    ]


def _configs(runs: list[StoredRun]) -> list[str]:
    lines = ["## Configuration of each run", ""]
    keys = (
        "model",
        "method",
        "precision",
        "seq_len",
        "micro_batch",
        "grad_accum",
        "packing",
        "padding",
        "grad_ckpt",
        "optim",
        "lora",
        "base_quant",
        "lr",
        "epochs",
        "max_steps",
        "seed",
        "data_path",
    )
    for r in runs:
        settings = {k: r.setting(k) for k in keys if r.setting(k) is not None}
        lines.append(
            f"- **{r.label}** ({r.kind}, from {r.source}): " + ", ".join(f"{k}={_flat(v)}" for k, v in settings.items())
        )
        data_config = (r.config or {}).get("data")
        if isinstance(data_config, dict):
            lines.append(f"  - data config: {_flat(data_config)}")
        if isinstance(r.record.get("data"), dict):
            lines.append(f"  - data as trained: {_flat(r.record['data'])}")
        if r.setting("precision_note"):  # peers: in the record, or in the DB's config column
            lines.append(f"  - note: {r.setting('precision_note')}")
        if r.evaluation:
            lines.append(f"  - eval: {_flat(r.evaluation)}")
    lines.append("")
    return lines


def _flat(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flat(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flat(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def peer_sessions(runs: list[StoredRun]) -> list[list[StoredRun]]:
    """Per database, the runs of its peer comparison: every peer row, and the tunelab rows interleaved with them.

    `tunelab bench peers` stores tunelab, peer A, peer B, tunelab, ... in order, in a database that may also
    hold sweeps of other configs. The comparison's tunelab runs are those from the one just before the first
    peer row to the one just after the last (rows in stored order); tunelab rows outside that span are not
    part of it. Run directories hold no peer runs, so they never enter a comparison.
    """
    sessions = []
    for source in dict.fromkeys(r.source for r in runs):
        rows = [r for r in runs if r.source == source and _has_rates(r)]
        peer_at = [i for i, r in enumerate(rows) if r.kind != "tunelab"]
        if not peer_at:
            continue
        lo, hi = peer_at[0], peer_at[-1]
        if lo > 0 and rows[lo - 1].kind == "tunelab":
            lo -= 1
        if hi + 1 < len(rows) and rows[hi + 1].kind == "tunelab":
            hi += 1
        span = rows[lo : hi + 1]
        if any(r.kind == "tunelab" for r in span):
            sessions.append(span)
    return sessions


def _peer_section(runs: list[StoredRun], out: Path) -> tuple[list[str], dict[str, Path]]:
    lines: list[str] = []
    files: dict[str, Path] = {}
    for n, group in enumerate(peer_sessions(runs), 1):
        kinds = ["tunelab", *dict.fromkeys(r.kind for r in group if r.kind != "tunelab")]
        by_kind = {k: [r for r in group if r.kind == k] for k in kinds}
        name = f"peers_{n}.png"
        plots.peers(
            kinds,
            [{key: [r.record[f"{key}_per_s"] for r in by_kind[k]] for key, _ in plots.TOKEN_KINDS} for k in kinds],
            [[r.record.get("peak_memory_bytes") or 0 for r in by_kind[k]] for k in kinds],
            out / name,
        )
        files[name] = out / name
        ratios = compare([{**r.record, "kind": r.kind} for r in group])
        rows = [
            [
                c["kind"],
                f"{c['runs']} / {c['tunelab_runs']}",
                num(c["tokens_nonpad_per_s"]),
                num(c["tunelab_tokens_nonpad_per_s"]),
                f"{c['tokens_nonpad_ratio']:.2f}x",
                f"{c['tokens_padded_ratio']:.2f}x",
                f"{c['tokens_loss_ratio']:.2f}x",
                f"{c['peak_memory_ratio']:.2f}x",
            ]
            for c in ratios
        ]
        notes = [f"- {r.label}: {r.setting('precision_note')}" for r in group if r.setting("precision_note")]
        lines += [
            f"## tunelab vs peers ({group[0].source}: {', '.join(r.label for r in group)})",
            "",
            "Same model, data file, machine and step counts; means over the interleaved runs. Ratios are "
            "tunelab / peer: above 1 tunelab is faster; for memory, below 1 tunelab needs less.",
            "",
            *table(
                [
                    "peer",
                    "runs (peer / tunelab)",
                    "peer non-pad tok/s",
                    "tunelab non-pad tok/s",
                    "non-pad ratio",
                    "padded ratio",
                    "loss-token ratio",
                    "peak memory ratio",
                ],
                rows,
            ),
            "",
            *notes,
            *([""] if notes else []),
            f"![Throughput and memory by trainer]({name})",
            "",
        ]
    return lines, files


def find_sweeps(runs: list[StoredRun]) -> list[tuple[str, list[StoredRun]]]:
    """Groups of tunelab runs that differ in exactly one of SWEEP_KEYS, with 2+ values of it."""
    ours = [r for r in runs if r.kind == "tunelab" and _has_rates(r)]
    sweeps = []
    for key in SWEEP_KEYS:
        groups: dict[str, list[StoredRun]] = {}
        for r in ours:
            rest = json.dumps([r.setting(k) for k in SWEEP_KEYS if k != key], default=str)
            groups.setdefault(rest, []).append(r)
        for members in groups.values():
            values = {json.dumps(r.setting(key), default=str) for r in members}
            if len(values) >= 2 and None not in (r.setting(key) for r in members):
                sweeps.append((key, sorted(members, key=lambda r: _sort_key(r.setting(key)))))
    return sweeps


def _sort_key(value: Any) -> tuple:
    return (0, float(value), "") if isinstance(value, (int, float)) else (1, 0.0, str(value))


def _sweep_section(runs: list[StoredRun], out: Path) -> tuple[list[str], dict[str, Path]]:
    lines: list[str] = []
    files: dict[str, Path] = {}
    for n, (key, members) in enumerate(find_sweeps(runs), 1):
        # Repeated runs of one value are averaged: interleaved repeats are how noise is measured.
        values: dict[str, list[StoredRun]] = {}
        for r in members:
            values.setdefault(_flat(r.setting(key)), []).append(r)
        names = list(values)
        rate = [statistics.fmean(r.record["tokens_nonpad_per_s"] for r in values[v]) for v in names]
        peak = [statistics.fmean(r.record.get("peak_memory_bytes") or 0 for r in values[v]) for v in names]
        name = f"sweep_{n}_{key}.png"
        plots.sweep(key, names, rate, peak, out / name)
        files[name] = out / name
        fixed = {k: members[0].setting(k) for k in SWEEP_KEYS if k != key and members[0].setting(k) is not None}
        lines += [
            f"## Sweep over {key}",
            "",
            "Held fixed: " + ", ".join(f"{k}={_flat(v)}" for k, v in fixed.items()),
            "",
            *table(
                [key, "runs", "non-pad tok/s (mean)", "peak memory (mean)"],
                [[v, str(len(values[v])), num(t), gib_cell(p)] for v, t, p in zip(names, rate, peak)],
            ),
            "",
            f"![Throughput and memory vs {key}]({name})",
            "",
        ]
    return lines, files


def _prediction_section(runs: list[StoredRun], out: Path) -> tuple[list[str], dict[str, Path]]:
    usable = [(r, p) for r in runs if (p := r.prediction()) is not None and r.record.get("step_time_s")]
    if not usable:
        return [], {}
    rows = [
        [
            r.label,
            num(p.step_time_s, 3),
            num(r.record["step_time_s"], 3),
            num(p.tokens_nonpad_per_s),
            num(r.record.get("tokens_nonpad_per_s")),
            gib_cell(p.peak_memory_bytes),
            gib_cell(r.record.get("peak_memory_bytes")),
            f"{r.record['step_time_s'] / p.step_time_s:.2f}",
        ]
        for r, p in usable
    ]
    cuda = all(r.record.get("peak_memory_reserved_bytes") is not None for r, _ in usable)
    memory_label = "measured: max allocated (CUDA)" if cuda else "measured: peak RSS above pre-load baseline"
    plots.predicted_vs_measured(
        [r.label for r, _ in usable],
        [(p.step_time_s, r.record["step_time_s"]) for r, p in usable],
        [
            (
                p.memory_breakdown or {"total (no breakdown stored)": p.peak_memory_bytes or 0},
                r.record.get("peak_memory_bytes") or 0,
            )
            for r, p in usable
        ],
        memory_label,
        out / "predicted_vs_measured.png",
    )
    lines = [
        "## Predicted (plan) vs measured",
        "",
        f"Predicted step time is plan's (train time over optimizer steps); measured is the median step of the "
        f"steady-state window. Memory: {memory_label}.",
        "",
        *table(
            [
                "run",
                "predicted s/step",
                "measured s/step",
                "predicted non-pad tok/s",
                "measured non-pad tok/s",
                "predicted peak",
                "measured peak",
                "measured / predicted time",
            ],
            rows,
        ),
        "",
        "![Predicted vs measured](predicted_vs_measured.png)",
        "",
    ]
    return lines, {"predicted_vs_measured.png": out / "predicted_vs_measured.png"}


def _curve_section(runs: list[StoredRun], out: Path) -> tuple[list[str], dict[str, Path]]:
    lines: list[str] = []
    files: dict[str, Path] = {}
    losses = {r.label: [(m["step"], m["loss"]) for m in r.metrics if m.get("loss") is not None] for r in runs}
    losses = {k: v for k, v in losses.items() if v}
    if losses:
        plots.loss_curves(losses, out / "loss.png")
        files["loss.png"] = out / "loss.png"
        lines += [
            "## Loss",
            "",
            "From each run's metrics.jsonl (one point per log step).",
            "",
            "![Training loss](loss.png)",
            "",
        ]
    # A log window that holds no step (train's log at the warm-up edge) is written with rate 0: not a measurement.
    rates = {
        r.label: [m for m in r.metrics if m.get("tokens_nonpad_per_s") and m.get("tokens_padded_per_s")] for r in runs
    }
    rates = {k: v for k, v in rates.items() if v}
    if rates:
        plots.throughput_curves(rates, out / "throughput.png")
        files["throughput.png"] = out / "throughput.png"
        lines += [
            "## Throughput over the run",
            "",
            "Tokens/s of each log window from metrics.jsonl.",
            "",
            "![Tokens per second over the run](throughput.png)",
            "",
        ]
    return lines, files


def _preference_section(runs: list[StoredRun], out: Path) -> tuple[list[str], dict[str, Path]]:
    """The preference metrics (objectives' `metrics`, as TRL names them) at each run's first and last log line."""
    names = list(dict.fromkeys(m for o in objectives.REGISTRY.values() for m in o.metrics))
    rows = []
    for r in runs:
        logged = [m for m in r.metrics if any(k in m for k in names)]
        if not logged:
            continue
        shown = [k for k in names if k in logged[-1]]
        for which, record in (("first", logged[0]), ("last", logged[-1])):
            cells = [f"{k} {num(record[k], 4)}" for k in shown]
            rows.append([r.label, f"{which} (step {record['step']})", num(record.get("loss"), 4), ", ".join(cells)])
    if not rows:
        return [], {}
    lines = ["## Preference metrics", "", "From each run's metrics.jsonl: means over the log window's pairs.", ""]
    return lines + table(["run", "log line", "loss", "metrics"], rows) + [""], {}


# ---------------------------------------------------------------- output


def render(runs: list[StoredRun], out: Path, title: str) -> tuple[str, dict[str, Path]]:
    """The markdown text and the plots it references, drawn into `out` (a scratch directory)."""
    lines = [f"# {title}", "", "Inputs: " + ", ".join(dict.fromkeys(r.source for r in runs)), ""]
    lines += _environment(runs) + _runs_table(runs)
    files: dict[str, Path] = {}
    for section in (_peer_section, _sweep_section, _prediction_section, _curve_section, _preference_section):
        more, drawn = section(runs, out)
        lines += more
        files.update(drawn)
    lines += _configs(runs)
    return "\n".join(lines), files


def write_report(runs: list[StoredRun], out: Path, title: str = "Performance report") -> list[Path]:
    """Draw into a scratch directory beside `out`, then rename each file into `out`, performance.md last."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=out, prefix=".tmp-report-"))
    except OSError as e:
        raise TunelabError(f"--out {out}: cannot write there ({e.strerror})") from None
    try:
        text, files = render(runs, scratch, title)
        (scratch / "performance.md").write_text(text)
        return move_files(scratch, out, [*files, "performance.md"])
    finally:
        for leftover in scratch.iterdir():
            leftover.unlink()
        scratch.rmdir()
