"""What the user sees during a run: a rich bar on a terminal, one plain line per log step otherwise.

The ETA is token-based (docs/metrics.md `eta_s`): padded tokens still to feed over the padded tokens/s so
far, so a run whose late batches are longer is not promised an early finish.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..io import gib


@dataclass
class LogLine:
    step: int
    total_steps: int
    loss: float
    lr: float
    tokens_nonpad_per_s: float
    peak_memory_bytes: int
    eta_s: float


def _fmt_eta(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class ProgressView:
    def __init__(self, total_steps: int, start_step: int, enabled: bool = True):
        self.enabled = enabled
        self.interactive = enabled and sys.stdout.isatty()
        self.console = Console()
        self.progress = None
        if self.interactive:
            self.progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self.task = self.progress.add_task("train", total=total_steps, completed=start_step, info="")
            self.progress.start()

    def update(self, line: LogLine) -> None:
        text = (
            f"loss {line.loss:.4f} | lr {line.lr:.2e} | {line.tokens_nonpad_per_s:,.0f} tok/s | "
            f"mem {gib(line.peak_memory_bytes)} | eta {_fmt_eta(line.eta_s)}"
        )
        if self.progress is not None:
            self.progress.update(self.task, completed=line.step, total=line.total_steps, info=text)
        elif self.enabled:
            print(f"step {line.step}/{line.total_steps} | {text}", flush=True)

    def note(self, text: str) -> None:
        """A line of its own (an evaluation, early stopping), above the bar on a terminal."""
        if self.progress is not None:
            self.progress.console.print(text, highlight=False, markup=False)
        elif self.enabled:
            print(text, flush=True)

    def advance(self, step: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=step)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
