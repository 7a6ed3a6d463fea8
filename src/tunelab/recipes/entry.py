"""The one entry to training: the config's objective row names its recipe (objectives.Objective.recipe), and
`train` runs it. `tunelab train`, bench, the demo and `tunelab.finetune` call this, never a recipe by name."""

from __future__ import annotations

from .. import objectives
from ..config import TrainConfig
from ..train.loop import Measurement
from .summary import RunSummary


def train(cfg: TrainConfig, show_progress: bool = True, measure: Measurement | None = None) -> RunSummary:
    """Run the job `cfg` describes with its objective's recipe and return its summary (also written to
    output_dir/summary.json). `measure`: what a measuring caller (bench, tests) asks of the run."""
    recipe = objectives.load(cfg.objective.row.recipe)
    return recipe(cfg, show_progress=show_progress, measure=measure)
