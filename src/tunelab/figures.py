"""A run's figures, each defined once: its key (summary.json's, eval.json's, the API's), the label a person reads,
its unit and how its value is written. The demo's closing table, `tunelab ui`'s "measured / plan's prediction"
table (through the run API's rows, written here so the page formats nothing itself) and docs/metrics.md's table of
them read this; tests/unit/test_figures.py checks that the doc and the page agree with it. Torch-free."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .io import GIB


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    unit: str
    write: Callable[[float], str]  # the value in `unit`, without the unit
    meaning: str

    def text(self, value) -> str:
        """`value` written in the figure's unit ('' when it was not recorded)."""
        if value is None:
            return ""
        return f"{self.write(value)} {self.unit}".strip()


FIGURES = {
    f.key: f
    for f in (
        Figure("train_s", "training time", "min", lambda s: f"{s / 60:.1f}", "wall time of the optimizer steps"),
        Figure("steps", "optimizer steps", "", lambda n: f"{n:,.0f}", "optimizer steps taken"),
        Figure(
            "tokens_padded_per_s",
            "tokens/s fed (padded)",
            "tokens/s",
            lambda x: f"{x:,.0f}",
            "every position fed to the model per second, padding included (what plan predicts)",
        ),
        Figure(
            "tokens_nonpad_per_s",
            "tokens/s non-padding",
            "tokens/s",
            lambda x: f"{x:,.0f}",
            "real tokens (prompt + response) per second",
        ),
        Figure(
            "tokens_loss_per_s",
            "tokens/s with loss",
            "tokens/s",
            lambda x: f"{x:,.0f}",
            "tokens with a loss target per second",
        ),
        Figure(
            "peak_memory_bytes",
            "peak memory",
            "GiB",
            lambda b: f"{b / GIB:.2f}",
            "the training's peak as plan counts it (docs/metrics.md's peak_memory_bytes; the demo's: above the "
            "process's memory before any model loaded)",
        ),
    )
}


def text(key: str, value) -> str:
    return FIGURES[key].text(value)


def row(key: str, measured, predicted) -> dict:
    """One row of a measured / predicted table, as the run API sends it: the key, label and unit, the values and
    their text."""
    figure = FIGURES[key]
    return {
        "figure": key,
        "label": figure.label,
        "unit": figure.unit,
        "measured": measured,
        "predicted": predicted,
        "measured_text": figure.text(measured),
        "predicted_text": figure.text(predicted),
    }


def markdown_rows() -> list[str]:
    """docs/metrics.md's table of the run figures: key, label, unit, meaning."""
    out = ["| key | label | unit | meaning |", "| --- | --- | --- | --- |"]
    out += [f"| `{f.key}` | {f.label} | {f.unit or '-'} | {f.meaning} |" for f in FIGURES.values()]
    return out
