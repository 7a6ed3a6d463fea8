"""Experiment trackers (`report_to`): TensorBoard or Weights & Biases through Accelerate's trackers.

The trackers get the records metrics.jsonl gets, under the same names and at the same steps (train/loop.py);
this module only decides what Accelerate is asked for: which tracker, where it writes, and with what settings.
Everything that can fail here (a missing package) fails before the run writes anything.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import TunelabError

# The distribution that provides each tracker; `tunelab[trackers]` installs tensorboard.
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}
TENSORBOARD_DIR = "tensorboard"
WANDB_PROJECT = "tunelab"


@dataclass(frozen=True)
class TrackerSetup:
    """`accelerator.init_trackers`'s arguments for one run, the Accelerator having been made with
    `log_with=report_to` and `project_dir=output_dir` (TensorBoard writes under it, in a folder named `project`)."""

    project: str
    init_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # one line each, printed before training


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def check_available(report_to: str) -> None:
    """Fail with the pip command when `report_to` names a tracker whose package is not installed.

    Accelerate itself would drop such a tracker without a word, and the run would log nowhere.
    """
    if report_to == "none":
        return
    package = PACKAGES[report_to]
    if not installed(package):
        extra = " (or pip install 'tunelab[trackers]')" if report_to == "tensorboard" else ""
        raise TunelabError(
            f"report_to: {report_to} needs the {package} package, which is not installed; "
            f"pip install {package}{extra}, or set report_to: none"
        )


def setup(report_to: str, out: Path, resume_step: int = 0, env: Mapping[str, str] | None = None) -> TrackerSetup | None:
    """What Accelerate needs to log this run to `report_to` (None for `none`).

    TensorBoard writes event files to `out/tensorboard`. A resumed run asks it to purge the steps after the
    checkpoint, as metrics.jsonl drops them, so a step is never shown twice. W&B writes its run under
    `out/wandb`; without WANDB_API_KEY (and with no WANDB_MODE chosen) it runs offline, to sync later.
    """
    if report_to == "none":
        return None
    if report_to == "tensorboard":
        kwargs = {"purge_step": resume_step + 1} if resume_step else {}
        logdir = out / TENSORBOARD_DIR
        note = f"tensorboard: logging to {logdir} (view with: tensorboard --logdir {logdir})"
        return TrackerSetup(TENSORBOARD_DIR, {"tensorboard": kwargs}, (note,))
    env = os.environ if env is None else env
    kwargs: dict[str, Any] = {"name": out.resolve().name, "dir": str(out)}
    notes: tuple[str, ...] = ()
    if not env.get("WANDB_API_KEY") and not env.get("WANDB_MODE"):
        kwargs["mode"] = "offline"
        notes = (f"wandb: no WANDB_API_KEY set, so logging offline to {out / 'wandb'} (upload later with wandb sync)",)
    return TrackerSetup(env.get("WANDB_PROJECT") or WANDB_PROJECT, {"wandb": kwargs}, notes)


def flat_config(values: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """A nested config as dotted keys with scalar values: what trackers accept as hyperparameters (TensorBoard
    takes no None or lists, so those become their YAML-like text)."""
    flat: dict[str, bool | int | float | str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_config(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        elif value is None:
            flat[name] = "null"
        else:
            flat[name] = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return flat
