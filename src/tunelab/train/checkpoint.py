"""Checkpoints that are atomic (temp dir + rename), rotated, and enough to resume exactly.

A checkpoint holds the trainable weights, the optimizer and scheduler states, the RNG states and the step
counter. The batch order is a pure function of (seed, epoch), so the step counter is all the data loader
needs to continue where it stopped.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..errors import TunelabError

PREFIX = "step-"


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done
    tokens_padded: int = 0
    tokens_nonpad: int = 0
    tokens_loss: int = 0
    elapsed_s: float = 0.0


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}


def save(folder: Path, model, optimizer, scheduler, state: TrainState, keep: int) -> Path:
    """Write `folder/step-N` atomically, then delete the oldest beyond `keep`."""
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{PREFIX}{state.step:07d}"
    tmp = folder / f".tmp-{PREFIX}{state.step:07d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({k: v.cpu() for k, v in trainable_state(model).items()}, tmp / "trainable.safetensors")
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": _rng_state()}, tmp / "optim.pt")
    (tmp / "state.json").write_text(json.dumps(asdict(state)))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(folder)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def find(folder: Path, resume: bool | str) -> Path | None:
    """`resume: true` takes the newest checkpoint in `folder` (None if there is none); a path takes that one."""
    if resume is False:
        return None
    if resume is True:
        found = list_checkpoints(folder)
        return found[-1] if found else None
    path = Path(resume)
    if not (path / "state.json").is_file():
        raise TunelabError(f"resume: {path} is not a tunelab checkpoint (no state.json); use true or a step-N folder")
    return path


def load_weights(path: Path, model) -> TrainState:
    """The checkpoint's trainable weights into `model` (built as for training); returns its counters."""
    weights = load_file(path / "trainable.safetensors")
    params = dict(model.named_parameters())
    missing = [n for n, p in params.items() if p.requires_grad and n not in weights]
    if missing:
        raise TunelabError(f"resume: {path} does not match this model/method (missing {missing[0]}); resume with the config it was made with")
    with torch.no_grad():
        for name, tensor in weights.items():
            params[name].copy_(tensor)
    return TrainState(**json.loads((path / "state.json").read_text()))


def load(path: Path, model, optimizer, scheduler) -> TrainState:
    state = load_weights(path, model)
    extra = torch.load(path / "optim.pt", weights_only=False)
    optimizer.load_state_dict(extra["optimizer"])
    scheduler.load_state_dict(extra["scheduler"])
    _set_rng_state(extra["rng"])
    return state


def _rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
