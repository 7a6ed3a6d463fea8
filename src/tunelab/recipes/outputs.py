"""The output directory's steps that every recipe takes, in one place: the writable check before anything loads,
the final save (adapter or model, atomic, a full disk ending the run with one line), best/ as at a checkpoint
resumed from, and the log lines past that checkpoint dropped."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from .. import methods
from ..errors import TunelabError
from ..io import atomic_dir, disk_errors, link_tree, write_atomic
from ..train import checkpoint
from ..train.checkpoint import TrainState
from ..train.lock import PROBE_PREFIX


def check_writable_dir(path: Path) -> None:
    """Fail before training if the output dir cannot be written: create it and a probe file, then undo that.

    A real write is the only reliable test (root passes every permission check; /proc refuses anyway).
    """
    created = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=PROBE_PREFIX):
            pass
    except OSError as e:
        raise TunelabError(f"output_dir {path}: cannot write there ({e.strerror}); choose another output_dir") from None
    finally:
        for p in created:  # deepest first
            if p.exists():
                p.rmdir()


def save_final(model, tokenizer, out: Path, method: str, weights: dict | None = None) -> Path:
    """`adapter/` (PEFT format) for adapter methods, `model/` (HF format) for full fine-tuning; atomic.
    `weights`: the model's state dict gathered from an FSDP run, whose own parameters are shards."""
    final = out / methods.get(method).saves
    save_pretrained(model, tokenizer, final, out, method, weights=weights)
    return final


BEST = checkpoint.BEST  # out/best, as each checkpoint names its copy of it
BEST_RECORD = "tunelab_best.json"


def save_pretrained(
    model, tokenizer, path: Path, out: Path, method: str, record: dict | None = None, weights: dict | None = None
) -> None:
    """The weights as the final save writes them (adapter or full model) plus the tokenizer, atomically;
    `record` goes beside them as BEST_RECORD. A full disk mid-save leaves the previous files as they were and
    ends the run with one line."""
    params = [p for p in model.parameters() if methods.get(method).trains_base or p.requires_grad]
    needed = sum(p.numel() * p.element_size() for p in params)
    with disk_errors(str(path), out, needed, after_disk_error(out)), atomic_dir(path) as tmp:
        model.save_pretrained(tmp, **({} if weights is None else {"state_dict": weights}))
        tokenizer.save_pretrained(tmp)
        if record is not None:
            (tmp / BEST_RECORD).write_text(json.dumps(record))


def restore_best(checkpoint_dir: Path, out: Path, state: TrainState) -> None:
    """Make `best/` what it was at the checkpoint: a run that died after it may have rewritten best/ with a step
    that the resumed run is about to train again (and, with other settings, may never reach)."""
    best = out / BEST
    record = best / BEST_RECORD
    on_disk = json.loads(record.read_text()).get("step") if record.is_file() else None
    if on_disk == state.best_step:
        return
    kept = checkpoint_dir / checkpoint.BEST
    if state.best_step is not None and kept.is_dir():
        with atomic_dir(best) as tmp:
            link_tree(kept, tmp)
    elif best.exists():
        shutil.rmtree(best)


def after_disk_error(out: Path) -> str:
    latest = checkpoint.list_checkpoints(out / "checkpoints")
    if latest:
        return f"free space, then run again with resume: true (checkpoint {latest[-1].name} is untouched)"
    return "free space or choose another output_dir, then run again (save_steps keeps checkpoints to resume from)"


def truncate_metrics(path: Path, step: int) -> float | None:
    """After a resume, drop log lines past the checkpoint: they are about to be produced again. Returns the first
    training loss the kept lines hold (None without one)."""
    if not path.exists():
        return None
    keep = [line for line in path.read_text().splitlines() if _logged_step(line) <= step]
    write_atomic(path, (line + "\n" for line in keep))
    return next((record["loss"] for record in map(json.loads, keep) if "loss" in record), None)


def _logged_step(line: str) -> float:
    """The step of a metrics line; a line a kill cut short counts as past every checkpoint, so it goes."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")
