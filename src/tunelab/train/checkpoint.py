"""Checkpoints that are atomic (temp dir + rename), verified, rotated, free of pickle, and enough to resume exactly.

A checkpoint holds the trainable weights, the optimizer and scheduler states, the RNG states and the step
counter. The batch order is a pure function of (seed, epoch), so the step counter is all the data loader
needs to continue where it stopped.

Tensors are stored in safetensors and everything else in JSON: loading a checkpoint never unpickles, so a
checkpoint from elsewhere cannot run code. `manifest.json`, written last, records every file's size and
sha256; resuming checks it and falls back to the newest checkpoint that matches its manifest.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ..errors import TunelabError
from ..io import atomic_dir, disk_errors, link_tree, write_atomic

PREFIX = "step-"
WEIGHTS = "trainable.safetensors"
RESUME_TENSORS = "resume.safetensors"  # optimizer state and torch RNG states
RESUME_JSON = "resume.json"  # the rest of the optimizer and scheduler states, Python and NumPy RNG states
STATE = "state.json"
IDENTITY = "identity.json"  # the settings that shape the trainable weights (model, method, LoRA rank, ...)
MANIFEST = "manifest.json"
REQUIRED = (WEIGHTS, RESUME_TENSORS, RESUME_JSON, STATE)

# Markers of the JSON encoding of nested state: a value that is one of these one-key objects stands for a
# tensor in RESUME_TENSORS, a tuple, a dict (as key/value pairs: optimizer state is keyed by int) or an array.
TENSOR, TUPLE, ITEMS, ARRAY = "__tensor__", "__tuple__", "__items__", "__ndarray__"


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done
    tokens_padded: int = 0
    tokens_nonpad: int = 0
    tokens_loss: int = 0
    elapsed_s: float = 0.0
    # Evaluation (train/loop.py): what early stopping and best/ need to continue after a resume.
    evaluations: int = 0
    eval_s: float = 0.0
    best_step: int | None = None
    best_eval_loss: float | None = None
    evals_since_best: int = 0
    # Where a schedule fitted to max_minutes ends (loop.ScheduleToLimit, schedule_within_limit); None: not fitted.
    schedule_steps: int | None = None


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}


BEST = "best"  # a checkpoint's hard-linked copy of the run's best/ at that step


def save(
    folder: Path,
    model,
    optimizer,
    scheduler,
    state: TrainState,
    keep: int,
    identity: dict | None = None,
    best: Path | None = None,
    gathered: tuple[dict, dict] | None = None,
) -> Path:
    """Write `folder/step-N` atomically, then delete the oldest beyond `keep`.

    `identity` (setting -> value) is what the weights were made with: a resume under other values is refused.
    `best`: the run's best-weights directory, kept inside as BEST (hard links), so a resume from here can put
    it back as it was.
    `gathered`: (trainable weights, optimizer state dict) that an FSDP run gathered (distributed.gather_checkpoint)
    in the same form as `model`'s and `optimizer`'s own, which then hold only this process's shards.
    """
    final = folder / f"{PREFIX}{state.step:07d}"
    if gathered is None:
        gathered = ({k: v.cpu() for k, v in trainable_state(model).items()}, optimizer.state_dict())
    weights, optimizer_state = gathered
    tensors: dict[str, torch.Tensor] = {}
    resume = _encode({"optimizer": optimizer_state, "scheduler": scheduler.state_dict(), "rng": _rng_state()}, tensors)
    needed = sum(t.nbytes for t in (*weights.values(), *tensors.values()))
    then = "free space or choose another output_dir, then resume: true (earlier checkpoints are untouched)"
    with disk_errors(f"checkpoint {final}", folder, needed, then), atomic_dir(final) as tmp:
        save_file(weights, tmp / WEIGHTS)
        save_file(tensors, tmp / RESUME_TENSORS)
        (tmp / RESUME_JSON).write_text(json.dumps(resume))
        (tmp / STATE).write_text(json.dumps(asdict(state)))
        if identity is not None:
            (tmp / IDENTITY).write_text(json.dumps(identity, sort_keys=True))
        if best is not None and best.is_dir():
            link_tree(best, tmp / BEST)
        write_manifest(tmp)
    for old in list_checkpoints(folder)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def write_manifest(folder: Path) -> None:
    """`manifest.json`: every other file's size and sha256, written last so that its presence means complete."""
    files = {
        p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MANIFEST
    }
    write_atomic(folder / MANIFEST, [json.dumps({"files": files}, indent=1)])


def verify(path: Path) -> str | None:
    """Why the checkpoint at `path` cannot be trusted, or None when every file matches its manifest."""
    try:
        files = json.loads((path / MANIFEST).read_text())["files"]
    except FileNotFoundError:
        return f"no {MANIFEST}"
    except (ValueError, KeyError, TypeError):
        return f"{MANIFEST} is not a tunelab manifest"
    for name in REQUIRED:
        if name not in files:
            return f"{MANIFEST} does not list {name}"
    for name, entry in files.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        size = file.stat().st_size
        if size != entry["bytes"]:
            return f"{name} has {size:,} bytes, the manifest says {entry['bytes']:,}"
        if _sha256(file) != entry["sha256"]:
            return f"{name} does not match its sha256"
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def list_checkpoints(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def refuse_earlier(folder: Path, out: Path) -> None:
    """A run that does not resume starts where no earlier run left checkpoints: its saves would mix with them,
    and a later `resume: true` could continue the earlier run under the new settings."""
    earlier = list_checkpoints(folder)
    if earlier:
        raise TunelabError(
            f"output_dir {out}: holds checkpoints of an earlier run (newest {earlier[-1].name}); resume=true "
            f"continues it; to start over, delete {folder} or choose another output_dir"
        )
    # Its best/ would outlive this run (which rewrites it only when it evaluates) and be taken for this run's.
    if (out / BEST).exists():
        raise TunelabError(
            f"output_dir {out}: holds {BEST}/, the best weights of an earlier run; to start over, delete "
            f"{out / BEST} or choose another output_dir"
        )


def find(folder: Path, resume: bool | str) -> Path | None:
    """`resume: true` takes the newest valid checkpoint in `folder` (None if there is none); a path takes that one.

    Checkpoints that fail their manifest (a crash or a full disk mid-write, a damaged file) are skipped with
    one line each on stderr; when every one fails, resuming stops rather than silently starting over.
    """
    if resume is False:
        return None
    if resume is True:
        skipped = []
        for path in reversed(list_checkpoints(folder)):
            reason = verify(path)
            if reason is None:
                for bad, why in skipped:
                    print(
                        f"checkpoint {bad} is incomplete or corrupt ({why}); resuming from {path}",
                        file=sys.stderr,
                        flush=True,
                    )
                return path
            skipped.append((path, reason))
        if skipped:
            newest, why = skipped[0]
            raise TunelabError(
                f"resume: no valid checkpoint in {folder} (newest {newest.name}: {why}); "
                f"set resume: false to start over"
            )
        return None
    path = Path(resume)
    if not (path / STATE).is_file():
        raise TunelabError(f"resume: {path} is not a tunelab checkpoint (no {STATE}); use true or a step-N folder")
    reason = verify(path)
    if reason is not None:
        raise TunelabError(
            f"resume: checkpoint {path} is incomplete or corrupt ({reason}); use resume: true for the newest valid one"
        )
    return path


def check_identity(path: Path, identity: dict) -> None:
    """Refuse a checkpoint made under other weight-shaping settings, naming the first that differs.

    Read before the model loads, so a wrong resume fails in a second; a checkpoint without IDENTITY is left
    to load_weights' shape check.
    """
    file = path / IDENTITY
    if not file.is_file():
        return
    saved = json.loads(file.read_text())
    for key in [*identity, *(k for k in saved if k not in identity)]:
        was, now = saved.get(key), identity.get(key)
        if was != now:
            raise TunelabError(
                f"resume: checkpoint {path} was made with {key}: {json.dumps(was)}, this config has "
                f"{key}: {json.dumps(now)}; set {key} back to resume, or resume: false to start over"
            )


def check_weights(path: Path, model) -> None:
    """Refuse a checkpoint whose weights do not fit `model` (built as for training), from the file's header
    alone: no tensor is read, so every process of a run can afford to check."""
    with safe_open(path / WEIGHTS, "pt") as f:
        shapes = {name: list(f.get_slice(name).get_shape()) for name in f.keys()}
    params = dict(model.named_parameters())
    missing = [n for n, p in params.items() if p.requires_grad and n not in shapes]
    if missing:
        raise TunelabError(
            f"resume: {path} does not match this model/method (missing {missing[0]}); resume with the config it was made with"
        )
    for name, shape in shapes.items():
        # A sharded (DTensor) parameter's shape is the full one, as the checkpoint holds it.
        if name in params and list(params[name].shape) != shape:
            raise TunelabError(
                f"resume: {path} holds {name} of shape {shape}, this model's is "
                f"{list(params[name].shape)} (another model or lora.r); resume with the config it was made with"
            )


def read_state(path: Path) -> TrainState:
    return TrainState(**json.loads((path / STATE).read_text()))


def read_resume(path: Path, optimizer: bool = True) -> dict:
    """The optimizer, scheduler and RNG states; without `optimizer`, the last two only (the optimizer's tensors,
    twice the trainable weights under AdamW, stay on disk)."""
    data = json.loads((path / RESUME_JSON).read_text())
    ((tag, items),) = data.items()
    if not optimizer:
        data = {tag: [[k, v] for k, v in items if k != "optimizer"]}
    with safe_open(path / RESUME_TENSORS, "pt") as f:
        return _decode(data, _Tensors(f))


class _Tensors:
    """A safetensors file's tensors by name, each read when asked for."""

    def __init__(self, handle) -> None:
        self.handle = handle

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.handle.get_tensor(name)


def load_weights(path: Path, model) -> TrainState:
    """The checkpoint's trainable weights into `model` (built as for training); returns its counters."""
    check_weights(path, model)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in load_file(path / WEIGHTS).items():
            params[name].copy_(tensor)
    return read_state(path)


def load(path: Path, model, optimizer, scheduler) -> TrainState:
    state = load_weights(path, model)
    resume = read_resume(path)
    optimizer.load_state_dict(resume["optimizer"])
    scheduler.load_state_dict(resume["scheduler"])
    set_rng_state(resume["rng"])
    return state


def _encode(value: Any, tensors: dict[str, torch.Tensor], key: str = "") -> Any:
    """`value` as JSON-safe data; its tensors go into `tensors` under dotted keys that the data refers to."""
    prefix = f"{key}." if key else ""
    if isinstance(value, torch.Tensor):
        tensors[key] = value.detach().cpu().contiguous()
        return {TENSOR: key}
    if isinstance(value, np.ndarray):
        return {ARRAY: [str(value.dtype), value.tolist()]}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return {TUPLE: [_encode(v, tensors, f"{prefix}{i}") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, tensors, f"{prefix}{i}") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {ITEMS: [[k, _encode(v, tensors, f"{prefix}{k}")] for k, v in value.items()]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"checkpoint state {key} is a {type(value).__name__}, which JSON and safetensors cannot hold")


def _decode(data: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(data, list):
        return [_decode(v, tensors) for v in data]
    if not isinstance(data, dict):
        return data
    ((tag, payload),) = data.items()
    if tag == TENSOR:
        return tensors[payload]
    if tag == TUPLE:
        return tuple(_decode(v, tensors) for v in payload)
    if tag == ITEMS:
        return {k: _decode(v, tensors) for k, v in payload}
    dtype, values = payload
    return np.array(values, dtype=dtype)


def _rng_state() -> dict:
    state = {"cpu": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
