"""bench's tables on the console (rich): one measured point beside plan's prediction, a sweep, tunelab beside its
peers, a calibration, and where a profiled step's time went."""

from __future__ import annotations

import sys
from pathlib import Path

from ..io import gib
from . import calibrate, store
from .points import step_stats


def _console():
    from rich.console import Console

    return Console(highlight=False)


def show_profile(found: dict, where: Path, as_json: bool) -> None:
    """One line on where the profiled steps' time went (stderr, so --json output stays one record a line)."""
    line = (
        f"profile: {where} ({found['steps']} steps of {found['step_wall_s']:.3f} s: host operators "
        f"{found['host_op_s_per_step']:.3f} s"
    )
    if found["device"] == "cpu":
        line += f", {found['aten_ops_per_step']:,.0f} operators per step)"
    else:
        verdict = "host-bound" if found["host_bound"] else "device-bound"
        line += (
            f", device busy {found['device_busy_s_per_step']:.3f} s ({found['device_busy_share']:.0%}), "
            f"{found['kernel_launches_per_step']:,.0f} kernel launches per step: {verdict})"
        )
    print(line, file=sys.stderr if as_json else sys.stdout, flush=True)


def show_single(rec: dict, db: Path) -> None:
    from rich.table import Table

    t = Table(title=f"{rec['model']} {rec['method']} {rec['precision']} on {rec['device']}")
    for col in ("metric", "measured", "predicted", "measured / predicted"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for key, label, fmt in (
        ("tokens_padded_per_s", "tokens/s fed (padded; window)", "{:,.0f}"),
        ("tokens_nonpad_per_s", "tokens/s non-padding (window)", "{:,.0f}"),
        ("tokens_loss_per_s", "tokens/s with loss (window)", "{:,.0f}"),
        ("step_time_s", "step time (median, s)", "{:.3f}"),
        ("peak_memory_bytes", "peak memory", None),
    ):
        measured, predicted = rec[key], rec[f"predicted_{key}"]
        show = gib if fmt is None else fmt.format
        t.add_row(label, show(measured), show(predicted), f"{measured / predicted:.2f}")
    t.add_row("mfu useful (whole row)", store.mfu_text(rec), "", "")
    t.add_row("hfu", f"{rec['hfu']:.1%}", "", "")
    c = _console()
    c.print(t)
    probes = ", ".join(f"{k} {v / 1e12:.2f}" for k, v in rec["peak_probes"].items())
    copy = f"; copy probe {rec['device_bandwidth_bps'] / 1e9:.1f} GB/s" if rec.get("device_bandwidth_bps") else ""
    if rec.get("mamf_flops"):
        shape = "x".join(map(str, rec["mamf_shape"]))
        copy += f"; MAMF {rec['mamf_flops'] / 1e12:.1f} TFLOP/s at {shape}, copy {rec['gpu_copy_bps'] / 1e9:.0f} GB/s"
    c.print(
        f"device peak {rec['device_peak_flops'] / 1e12:.2f} TFLOP/s ({rec['peak_source']}); probes TFLOP/s: {probes}"
        f"{copy}"
    )
    c.print(
        f"FLOPs/token (plan): {rec['model_flops_per_token'] / 1e9:.3f} G model, {rec['hardware_flops_per_token'] / 1e9:.3f} G hardware; "
        f"window: {rec['steps']} steps after {rec['warmup_steps']} warm-up"
    )
    c.print(f"tokens/s are window rates (tokens over the window's {rec['steady_window_s']:.2f} s); {step_stats(rec)}")
    if rec["peak_memory_reserved_bytes"] is None:
        c.print(
            f"peak memory: peak RSS minus RSS before model load (absolute peak RSS {gib(rec['peak_memory_absolute_bytes'])})"
        )
    else:
        c.print(f"peak memory: max allocated (max reserved {gib(rec['peak_memory_reserved_bytes'])})")
    c.print(f"prediction: plan --gpu local, {rec['predicted_source']}")
    c.print(f"stored in {db}")


def _peer_table(title: str, columns: dict, rows: list[dict], footer: str) -> None:
    """One row per peer: its name, then `columns` (each header and how a row's cell is written), then both
    sides' peak memory."""
    from rich.table import Table

    columns = {
        "peer": lambda r: r["kind"],
        **columns,
        "peer peak mem": lambda r: gib(r["peak_memory_bytes"]),
        "tunelab peak mem": lambda r: gib(r["tunelab_peak_memory_bytes"]),
    }
    t = Table(title=title)
    for header in columns:
        t.add_column(header, justify="right")
    for r in rows:
        t.add_row(*(cell(r) for cell in columns.values()))
    c = _console()
    c.print(t)
    c.print(footer)


def show_comparison(rows: list[dict], db: Path) -> None:
    _peer_table(
        "tunelab beside its peers (same model, data, machine; means over interleaved runs)",
        {
            "peer non-pad tok/s": lambda r: f"{r['tokens_nonpad_per_s']:,.1f}",
            "tunelab non-pad tok/s": lambda r: f"{r['tunelab_tokens_nonpad_per_s']:,.1f}",
            "tunelab / peer": lambda r: f"{r['tokens_nonpad_ratio']:.2f}x",
            "padded ratio": lambda r: f"{r['tokens_padded_ratio']:.2f}x",
            "loss-token ratio": lambda r: f"{r['tokens_loss_ratio']:.2f}x",
        },
        rows,
        f"stored in {db}",
    )


def show_grpo_comparison(rows: list[dict], db: Path) -> None:
    """bench/grpo_peer.py's rows: completions per second first (the work a GRPO step exists for)."""
    _peer_table(
        "tunelab's GRPO beside its peer (same model, prompts, rewards, completions per step)",
        {
            "peer completions/s": lambda r: f"{r['completions_per_s']:.3f}",
            "tunelab completions/s": lambda r: f"{r['tunelab_completions_per_s']:.3f}",
            "tunelab / peer": lambda r: f"{r['completions_per_s_ratio']:.2f}x",
            "completion tok/s ratio": lambda r: f"{r['completion_tokens_per_s_ratio']:.2f}x",
            "mean length (peer, tunelab)": lambda r: (
                f"{r['completion_mean_length']:.1f}, {r['tunelab_completion_mean_length']:.1f}"
            ),
        },
        rows,
        f"stored in {db}",
    )


def show_sweep(records: list[dict], db: Path, labels: list[str], failed: dict[str, tuple[str, int]]) -> None:
    """The sweep's points in their order; one that ran out of memory shows as such."""
    from rich.table import Table

    t = Table(title=f"sweep on {records[0]['device']}")
    for col in (
        "point",
        "tok/s fed (window)",
        "tok/s non-pad (window)",
        "step s (median)",
        "mfu useful (whole row)",
        "peak mem",
        "pred tok/s fed",
        "pred mem",
    ):
        t.add_column(col, justify="left" if col == "point" else "right")
    measured = {r["label"]: r for r in records}
    for label in labels:
        if label in failed:
            t.add_row(label, "out of memory", *[""] * 5, gib(failed[label][1]))
            continue
        r = measured[label]
        t.add_row(
            r["label"],
            f"{r['tokens_padded_per_s']:,.0f}",
            f"{r['tokens_nonpad_per_s']:,.0f}",
            f"{r['step_time_s']:.3f}",
            store.mfu_text(r),
            gib(r["peak_memory_bytes"]),
            f"{r['predicted_tokens_padded_per_s']:,.0f}",
            gib(r["predicted_peak_memory_bytes"]),
        )
    c = _console()
    c.print(t)
    c.print(
        "device peak per precision: "
        + "; ".join(
            sorted(
                {f"{r['precision']}: {r['device_peak_flops'] / 1e12:.2f} TFLOP/s ({r['peak_source']})" for r in records}
            )
        )
    )
    c.print(f"stored in {db}")


def show_calibration(record, points: list[calibrate.Point], path: Path, db: Path) -> None:
    from rich.table import Table

    t = Table(title=f"calibration of {record.device_name}")
    for col in ("method", "tok/s fed", "step / model's", "efficiency", "peak mem", "model w/o overhead", "gap"):
        t.add_column(col, justify="left" if col == "method" else "right")
    for p in points:
        scale = record.step_scale.get(calibrate.scale_key(p.method_key, p.compiled))
        t.add_row(
            p.method_key,
            f"{p.tokens_padded_per_s:,.0f}",
            f"{p.measured_step_s:.3f} / {p.model_step_s:.3f} s (x {scale:.3f})" if scale else "-",
            f"{record.efficiency[p.method_key]:.3f}",
            gib(p.peak_memory_bytes),
            gib(p.memory_without_overhead),
            gib(p.peak_memory_bytes - p.memory_without_overhead),
        )
    c = _console()
    c.print(t)
    c.print(
        f"peak {record.peak_flops / 1e12:.2f} TFLOP/s {record.peak_dtype}; runtime overhead "
        f"{gib(record.runtime_overhead_bytes)} (from the {points[0].method_key} run)"
    )
    c.print(f"saved {path}: `tunelab plan --gpu local` now uses it; runs stored in {db}")
