"""The figures of `tunelab report`, drawn with matplotlib's object API (Agg, no display, no global pyplot state).

Each function takes only numbers that came from the inputs and a path to write a PNG to; the caller decides
which figures a report has. Units are in every axis label.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from ..io import GIB

DPI = 110
TOKEN_KINDS = (  # (record key prefix, legend label): docs/metrics.md's three token counts
    ("tokens_nonpad", "non-padding tokens/s"),
    ("tokens_padded", "padded tokens/s (all positions fed)"),
    ("tokens_loss", "loss tokens/s"),
)


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, format="png")


def loss_curves(curves: dict[str, list[tuple[int, float]]], path: Path) -> None:
    """Training loss against optimizer step, one line per run."""
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.add_subplot()
    for label, points in curves.items():
        steps, losses = zip(*points)
        ax.plot(steps, losses, marker="o" if len(points) < 30 else None, markersize=3, label=label)
    ax.set_title("Training loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (mean cross-entropy per loss token, nats)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def throughput_curves(curves: dict[str, list[dict]], path: Path) -> None:
    """Tokens/s of each log window over the run (metrics.jsonl), non-padding solid, padded dashed."""
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.add_subplot()
    for label, rows in curves.items():
        steps = [r["step"] for r in rows]
        (line,) = ax.plot(
            steps, [r["tokens_nonpad_per_s"] for r in rows], marker="o", markersize=3, label=f"{label}: non-padding"
        )
        ax.plot(
            steps,
            [r["tokens_padded_per_s"] for r in rows],
            linestyle="--",
            color=line.get_color(),
            label=f"{label}: padded",
        )
    ax.set_title("Throughput over the run (per log window; the first window includes warm-up)")
    ax.set_xlabel("optimizer step (end of log window)")
    ax.set_ylabel("tokens/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def sweep(key: str, values: list[str], tokens_per_s: list[float], peak_bytes: list[float], path: Path) -> None:
    """Throughput and peak memory across the values of one config key (the others held fixed)."""
    fig = Figure(figsize=(9, 3.8))
    ax1, ax2 = fig.subplots(1, 2)
    x = range(len(values))
    ax1.plot(x, tokens_per_s, marker="o")
    ax1.set_title(f"Throughput vs {key}")
    ax1.set_ylabel("non-padding tokens/s (steady state)")
    ax2.plot(x, [b / GIB for b in peak_bytes], marker="o", color="tab:red")
    ax2.set_title(f"Peak memory vs {key}")
    ax2.set_ylabel("peak memory (GiB)")
    for ax in (ax1, ax2):
        ax.set_xticks(list(x), values)
        ax.set_xlabel(key)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    _save(fig, path)


def predicted_vs_measured(
    labels: list[str],
    step_time: list[tuple[float, float]],
    memory: list[tuple[dict[str, float], float]],
    memory_label: str,
    path: Path,
) -> None:
    """Left: seconds per optimizer step, predicted vs measured. Right: plan's memory breakdown (stacked) vs the
    measured peak, per run."""
    fig = Figure(figsize=(12, 4.4))
    ax1, ax2 = fig.subplots(1, 2)
    width = 0.38
    x = list(range(len(labels)))
    ax1.bar([i - width / 2 for i in x], [p for p, _ in step_time], width, label="predicted (plan)")
    ax1.bar([i + width / 2 for i in x], [m for _, m in step_time], width, label="measured (median step)")
    ax1.set_title("Time per optimizer step")
    ax1.set_ylabel("seconds")
    parts = list(dict.fromkeys(k for breakdown, _ in memory for k in breakdown))
    bottoms = [0.0] * len(labels)
    for part in parts:
        heights = [breakdown.get(part, 0) / GIB for breakdown, _ in memory]
        ax2.bar(
            [i - width / 2 for i in x], heights, width, bottom=bottoms, label=f"predicted: {part.replace('_', ' ')}"
        )
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax2.bar([i + width / 2 for i in x], [m / GIB for _, m in memory], width, color="black", label=memory_label)
    ax2.set_title("Peak memory: plan's breakdown vs measured")
    ax2.set_ylabel("GiB")
    for ax in (ax1, ax2):
        ax.set_xticks(x, labels, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: the bars fill the axes
    _save(fig, path)


def peers(kinds: list[str], runs: list[dict[str, list[float]]], memory: list[list[float]], path: Path) -> None:
    """Grouped bars per kind (tunelab and each peer): the three tokens/s, mean with min-max whiskers over runs;
    and peak memory per kind."""
    fig = Figure(figsize=(10, 4.4))
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    width = 0.26
    for j, (key, label) in enumerate(TOKEN_KINDS):
        means, lo, hi = [], [], []
        for per_kind in runs:
            values = per_kind[key]
            mean = sum(values) / len(values)
            means.append(mean)
            lo.append(mean - min(values))
            hi.append(max(values) - mean)
        xs = [i + (j - 1) * width for i in range(len(kinds))]
        bars = ax1.bar(xs, means, width, yerr=[lo, hi], capsize=3, label=label)
        if key == "tokens_nonpad":
            ax1.bar_label(bars, fmt="%.0f", fontsize=7)
    ax1.set_title("Throughput by trainer (mean over runs; whiskers: min-max)")
    ax1.set_ylabel("tokens/s (steady state)")
    ax1.set_xticks(range(len(kinds)), kinds, fontsize=8)
    ax1.legend(fontsize=7)
    ax1.grid(axis="y", alpha=0.3)
    ax2.bar(range(len(kinds)), [sum(m) / len(m) / GIB for m in memory], color="tab:gray")
    ax2.set_title("Peak memory by trainer")
    ax2.set_ylabel("GiB (mean over runs)")
    ax2.set_xticks(range(len(kinds)), kinds, fontsize=8, rotation=15)
    ax2.grid(axis="y", alpha=0.3)
    _save(fig, path)


def accuracy_curve(runs: dict[str, list[tuple[float, float]]], path: Path) -> None:
    """Held-out exact match against training minutes, one line per run: (minutes, accuracy 0..1) points."""
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.add_subplot()
    for label, points in runs.items():
        minutes, accuracy = zip(*sorted(points))
        ax.plot(minutes, [100 * a for a in accuracy], marker="o", markersize=4, label=label)
    ax.set_title("Exact match on held-out additions against training time")
    ax.set_xlabel("training minutes (wall clock, from the first step)")
    ax.set_ylabel("exact match (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
